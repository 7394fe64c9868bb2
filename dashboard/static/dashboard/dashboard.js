/* Durable dashboard: live refresh over a websocket, messages for refused requests,
 * and keeping <details> open across fragment swaps. Needs htmx (loaded before, deferred).
 *
 * Live updates: <body data-live-url="/ws/runs/" data-since="123"> opens a websocket.
 * Each {"type": "refresh"} message triggers the "durable:refresh" event on every
 * [data-live] element, whose hx-get re-fetches its fragment. The socket only says
 * "look again"; the data always comes from the server over HTTP.
 */
(function () {
  "use strict";

  var body = document.body;

  // --- messages for refused requests (403, 404, 5xx, network) -----------------------

  var toasts = document.getElementById("toasts");

  function toast(text, level) {
    if (!toasts) return;
    var item = document.createElement("div");
    item.className = "toast toast-" + (level || "error");
    item.setAttribute("role", level === "error" ? "alert" : "status");
    var p = document.createElement("p");
    p.textContent = text; // never innerHTML: the text may come from user data
    var close = document.createElement("button");
    close.type = "button";
    close.className = "toast-close";
    close.setAttribute("aria-label", "Dismiss");
    close.textContent = "×";
    close.addEventListener("click", function () { item.remove(); });
    item.appendChild(p);
    item.appendChild(close);
    toasts.appendChild(item);
    setTimeout(function () { item.remove(); }, 12000);
  }

  function messageFrom(xhr) {
    try {
      var doc = new DOMParser().parseFromString(xhr.responseText || "", "text/html");
      var el = doc.querySelector("[data-message]");
      if (el && el.textContent.trim()) return el.textContent.trim();
    } catch (e) { /* not HTML */ }
    return "";
  }

  document.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail.xhr;
    var text = messageFrom(xhr);
    if (!text) {
      text = xhr.status === 404 ? "Not found: it may have been deleted."
        : xhr.status === 403 ? "Not allowed."
          : "The server answered " + xhr.status + ". Nothing was changed; try again.";
    }
    toast(text, "error");
  });

  document.addEventListener("htmx:sendError", function () {
    toast("The server cannot be reached. Check the connection and try again.", "error");
  });

  // --- keep <details> as the user left them when a fragment is swapped ---------------

  var detailsState = null;

  document.addEventListener("htmx:beforeSwap", function () {
    detailsState = {};
    document.querySelectorAll("details[id]").forEach(function (d) {
      detailsState[d.id] = d.open;
    });
  });

  document.addEventListener("htmx:afterSettle", function () {
    if (detailsState) {
      Object.keys(detailsState).forEach(function (id) {
        var d = document.getElementById(id);
        if (d && d.open !== detailsState[id]) d.open = detailsState[id];
      });
      detailsState = null;
    }
  });

  // an action's message arrives out of band in #flash: move focus there
  document.addEventListener("htmx:oobAfterSwap", function (evt) {
    var target = evt.detail.target;
    if (target && target.id === "flash") {
      setTimeout(function () {
        var msg = document.querySelector("#flash .flash");
        if (msg) msg.focus();
      }, 0);
    }
  });

  // --- live updates ----------------------------------------------------------------

  var liveUrl = body.getAttribute("data-live-url");
  var indicator = document.getElementById("live-status");

  function setState(state, text) {
    if (!indicator) return;
    indicator.setAttribute("data-state", state);
    var label = indicator.querySelector(".live-text");
    if (label) label.textContent = text;
  }

  if (!liveUrl || !("WebSocket" in window) || !window.htmx) return;

  var since = body.getAttribute("data-since") || "";
  var retries = 0;
  var timer = null;

  function editing(el) {
    // do not replace a form the user is filling in; refresh once they are done
    var active = document.activeElement;
    if (active && el.contains(active) && active.matches(
      "textarea, select, input:not([type=radio]):not([type=checkbox]):not([type=hidden]):not([type=submit])")) {
      return true;
    }
    var fields = el.querySelectorAll("textarea, input[type=text], input[type=number], input[type=search]");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) return true;
    }
    return false;
  }

  function refresh() {
    timer = null;
    var paused = false;
    document.querySelectorAll("[data-live]").forEach(function (el) {
      if (editing(el)) { paused = true; return; }
      htmx.trigger(el, "durable:refresh");
    });
    if (paused) {
      setState("paused", "Paused while you edit");
      timer = setTimeout(refresh, 2000);
    } else {
      setState("on", "Live");
    }
  }

  function schedule() {
    if (!timer) timer = setTimeout(refresh, 150); // coalesce bursts of events
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var url = scheme + location.host + liveUrl + (since ? "?since=" + encodeURIComponent(since) : "");
    var socket;
    try {
      socket = new WebSocket(url);
    } catch (e) {
      setState("off", "Live off");
      return;
    }
    socket.onopen = function () {
      retries = 0;
      setState("on", "Live");
    };
    socket.onmessage = function (evt) {
      var msg;
      try { msg = JSON.parse(evt.data); } catch (e) { return; }
      if (msg.last) since = String(msg.last);
      if (msg.type === "refresh") schedule();
    };
    socket.onclose = function (evt) {
      if (evt.code === 4403) { setState("off", "Live off"); return; }
      setState("reconnecting", "Reconnecting…");
      retries = Math.min(retries + 1, 6);
      var delay = Math.min(30000, 500 * Math.pow(2, retries)) * (0.5 + Math.random() / 2);
      setTimeout(connect, delay);
    };
  }

  connect();
})();
