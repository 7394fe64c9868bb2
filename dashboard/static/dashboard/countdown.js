/* Durable dashboard: approval deadlines count down, and a request past its deadline is
 * greyed out with its buttons disabled. No inline script: loaded from static/ (CSP).
 *
 * Markup (templates/dashboard/approvals.html, and run_detail.html for a run's own requests):
 *   <div id="inbox" data-server-now="<ms since epoch when the page was rendered>">
 *   <article data-approval> ... <span data-countdown data-deadline="<ms>"
 *        data-then="counts as rejected" data-expired-text="expired at 12:00:00: ..."> ...
 *
 * The server's clock is the one that counts: the browser's offset from it is measured on
 * each swap of #inbox and applied. The greying is a hint only; the server refuses a
 * decision at or after the deadline whatever the page shows.
 */
(function () {
  "use strict";

  var offset = 0; // server clock minus browser clock, in ms

  function measure(root) {
    // the inbox, or a run's page deciding in place: whatever carries the server's time
    var el = root && root.querySelector ? (root.matches && root.matches("[data-server-now]") ? root : root.querySelector("[data-server-now]")) : null;
    var server = el ? parseInt(el.getAttribute("data-server-now"), 10) : NaN;
    if (!isNaN(server)) offset = server - Date.now();
  }

  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function left(ms) {
    var s = Math.ceil(ms / 1000);
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    // days with their hours: 2 d 23 h left is not "2 d" (dashboard_tags.since agrees)
    if (h >= 48) return Math.floor(h / 24) + " d" + (h % 24 ? " " + (h % 24) + " h" : "");
    if (h > 0) return h + " h " + pad(m) + " min";
    return m + ":" + pad(sec);
  }

  function expire(chip) {
    var card = chip.closest("[data-approval]");
    chip.textContent = chip.getAttribute("data-expired-text") || "expired";
    chip.setAttribute("data-state", "expired");
    if (!card) return;
    card.classList.add("is-expired");
    var note = card.querySelector(".expired-note");
    if (note) note.hidden = false;
    card.querySelectorAll("button[type=submit]").forEach(function (b) { b.disabled = true; });
  }

  function tick() {
    var now = Date.now() + offset;
    document.querySelectorAll("[data-countdown]").forEach(function (chip) {
      if (chip.getAttribute("data-state") === "expired") return;
      var deadline = parseInt(chip.getAttribute("data-deadline"), 10);
      if (isNaN(deadline)) return;
      var ms = deadline - now;
      if (ms <= 0) {
        expire(chip);
      } else {
        chip.textContent = "expires in " + left(ms) + ", then " + (chip.getAttribute("data-then") || "expires");
      }
    });
  }

  measure(document);
  document.addEventListener("htmx:afterSwap", function (evt) { measure(evt.target); tick(); });
  tick();
  setInterval(tick, 1000);
})();
