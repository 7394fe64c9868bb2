// The run page's live output: the run's stream (docs/streaming.md) read with an
// EventSource from /runs/<id>/stream/ (dashboard/streams.py). Each try of a streamed
// model call is a block: its text as the tokens arrive, its tool calls as they are made.
// An `interrupted` event closes the cut-off try with the reason, and the call asked
// again starts a new block, so what was cut off stays visible and is never mixed with
// the new answer. Text goes in with textContent only (a model's words are never HTML).
(function () {
  "use strict";

  var REASONS = {
    worker_lost: "Cut off: the worker was lost. The call is asked again.",
    failed: "This try failed. The call is asked again."
  };

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function start(panel) {
    if (panel.getAttribute("data-stream-started")) return;
    panel.setAttribute("data-stream-started", "1");
    var url = panel.getAttribute("data-stream-url");
    var list = panel.querySelector(".stream-tries");
    var state = panel.querySelector(".stream-state");
    var current = {}; // step id -> its try being streamed
    var last = 0;
    var source = null;

    function setState(text, name) {
      state.textContent = text;
      panel.setAttribute("data-stream-state", name);
    }

    function tryOf(stepId) {
      var t = current[stepId];
      if (t) return t;
      // a try whose start was read before this page (or a reconnect): a block all the same
      return newTry(stepId, "");
    }

    function newTry(stepId, model) {
      var block = el("article", "stream-try");
      block.setAttribute("data-step", stepId);
      var head = el("header", "stream-head");
      head.appendChild(el("code", "", stepId));
      if (model) head.appendChild(el("span", "muted", " " + model));
      var status = el("span", "stream-try-state", "streaming…");
      head.appendChild(status);
      var text = el("pre", "stream-text");
      var tools = el("ul", "stream-tools");
      block.appendChild(head);
      block.appendChild(text);
      block.appendChild(tools);
      list.appendChild(block);
      panel.hidden = false;
      var t = { block: block, status: status, text: text, tools: tools, calls: {} };
      current[stepId] = t;
      return t;
    }

    function finish(stepId, name, text) {
      var t = current[stepId];
      if (!t) return;
      t.block.setAttribute("data-state", name);
      t.status.textContent = text;
      delete current[stepId];
    }

    function call(t, index) {
      var c = t.calls[index];
      if (c) return c;
      var item = el("li", "stream-tool");
      var name = el("code", "stream-tool-name", "tool");
      var args = el("span", "stream-tool-args", "");
      item.appendChild(name);
      item.appendChild(args);
      t.tools.appendChild(item);
      c = t.calls[index] = { item: item, name: name, args: args };
      return c;
    }

    var on = {
      step_started: function (e) {
        finish(e.step_id, "superseded", "superseded");
        newTry(e.step_id, (e.data && e.data.model) || "");
      },
      token: function (e) {
        tryOf(e.step_id).text.textContent += e.data.delta;
      },
      refusal: function (e) {
        var t = tryOf(e.step_id);
        t.block.setAttribute("data-refused", "true");
        t.text.textContent += e.data.delta;
      },
      tool_call_started: function (e) {
        var c = call(tryOf(e.step_id), e.data.index);
        c.name.textContent = e.data.name || "tool";
      },
      tool_call_delta: function (e) {
        call(tryOf(e.step_id), e.data.index).args.textContent += e.data.delta;
      },
      tool_call_ended: function (e) {
        var c = call(tryOf(e.step_id), e.data.index);
        c.name.textContent = e.data.name || c.name.textContent;
        c.args.textContent = e.data.arguments;
        c.item.setAttribute("data-state", "ended");
      },
      step_ended: function (e) {
        if (e.data && e.data.error) finish(e.step_id, "failed", "failed: " + e.data.error);
        else finish(e.step_id, "ended", "done");
      },
      interrupted: function (e) {
        var reason = (e.data && e.data.reason) || "worker_lost";
        if (!current[e.step_id]) return; // nothing shown here was cut off (a graph's super-step)
        finish(e.step_id, "interrupted", REASONS[reason] || (e.data && e.data.message) || reason);
      }
    };

    function connect() {
      source = new EventSource(url + (last ? "?after=" + last : ""));
      setState("Live", "live");
      Object.keys(on).forEach(function (kind) {
        source.addEventListener(kind, function (msg) {
          var event;
          try { event = JSON.parse(msg.data); } catch (err) { return; }
          if (event.seq <= last) return;
          last = event.seq;
          on[kind](event);
        });
      });
      source.addEventListener("end", function () {
        source.close();
        source = null;
        setState("", "ended");
      });
      source.onerror = function () {
        if (source && source.readyState === EventSource.CLOSED) {
          source = null;
          setState("Live output off", "off");
        } else {
          setState("Reconnecting…", "reconnecting");
        }
      };
    }

    // the run may stream again after it waited (an approval, a timer): each refresh of
    // the page (a hint from the live socket) reopens a stream that had ended
    document.body.addEventListener("htmx:afterSettle", function () {
      if (!source && document.body.contains(panel)) connect();
    });
    connect();
  }

  function scan(root) {
    var panels = root.querySelectorAll ? root.querySelectorAll("[data-stream-url]") : [];
    for (var i = 0; i < panels.length; i++) start(panels[i]);
  }

  scan(document);
  if (window.htmx) window.htmx.onLoad(scan);
})();
