/* Durable dashboard: keyboard shortcuts of the approvals inbox. No inline script (CSP).
 *
 *   j / k   next / previous request (the current one is focused and outlined)
 *   a       focus the current request's Approve button (Enter then approves: a key alone
 *           never decides)
 *   r       focus its comment box (a rejection needs one), then its Reject button is next
 *   e       open "Edit the parameters" and focus the box
 *   ?       show or hide this list; Escape hides it
 *
 * Keys typed in a field, or with Ctrl, Alt or Meta, are left alone. The current request is
 * kept across the inbox's live refreshes (by its id) while it is still pending, and so is
 * the focus within it.
 */
(function () {
  "use strict";

  var currentId = null;

  function cards() {
    return Array.prototype.slice.call(document.querySelectorAll("#inbox article[data-approval]"));
  }

  function typing(el) {
    if (!el) return false;
    var tag = el.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || el.isContentEditable;
  }

  function current() {
    var list = cards();
    var found = currentId && document.getElementById(currentId);
    return found && list.indexOf(found) >= 0 ? found : null;
  }

  function select(card) {
    cards().forEach(function (c) { c.classList.remove("is-current"); });
    if (!card) return;
    currentId = card.id;
    card.classList.add("is-current");
    card.setAttribute("tabindex", "-1");
    card.focus({ preventScroll: true });
    card.scrollIntoView({ block: "nearest" });
  }

  function move(step) {
    var list = cards();
    if (!list.length) return;
    var at = list.indexOf(current());
    var next = at < 0 ? (step > 0 ? 0 : list.length - 1) : Math.min(Math.max(at + step, 0), list.length - 1);
    select(list[next]);
  }

  function within(selector, then) {
    var card = current() || cards()[0];
    if (!card) return;
    if (card !== current()) select(card);
    var el = card.querySelector(selector);
    if (!el || el.disabled) return;
    if (then) then(el);
    el.focus();
  }

  function help() {
    var dialog = document.getElementById("shortcuts-help");
    if (!dialog) return;
    if (dialog.open) dialog.close(); else dialog.showModal();
  }

  document.addEventListener("keydown", function (event) {
    if (!document.getElementById("inbox")) return;
    if (event.ctrlKey || event.altKey || event.metaKey || typing(event.target)) return;
    var done = true;
    switch (event.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "a": within("button[value=approve]"); break;
      case "r": within("textarea[name=comment]"); break;
      case "e": within("details.edit-params", function (d) { d.open = true; });
        within("details.edit-params textarea"); break;
      case "?": help(); break;
      default: done = false;
    }
    if (done) event.preventDefault();
  });

  // A live refresh replaces the inbox's cards: the keyboard's place (the current card,
  // its Approve or Reject button, its comment box) is found again in the new card, so a
  // refresh between "a" and Enter does not leave Enter to the page.
  var focused = null;

  document.addEventListener("htmx:beforeSwap", function () {
    var card = current();
    var active = document.activeElement;
    focused = null;
    if (!card || !active || !card.contains(active)) return;
    if (active === card) focused = "card";
    else if (active.matches("button[value]")) focused = "button[value=" + active.value + "]";
    else if (active.matches("textarea[name=comment]")) focused = "textarea[name=comment]";
  });

  // htmx:load, not afterSwap: the inbox swaps its outerHTML, and afterSwap is sent to the
  // element swapped out, which is no longer in the document to bubble to it
  document.addEventListener("htmx:load", function () {
    var card = current();
    var was = focused;
    focused = null;
    if (!card) return;
    card.classList.add("is-current");
    if (!was) return;
    var el = was === "card" ? card : card.querySelector(was);
    var active = document.activeElement;
    // only where the swap dropped the focus (to the page): a key pressed since moved it
    if (!el || (active && active !== document.body)) return;
    if (el === card) card.setAttribute("tabindex", "-1");
    el.focus({ preventScroll: true });
  });
})();
