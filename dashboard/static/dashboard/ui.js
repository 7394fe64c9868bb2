// The theme the person chose (auto, light, dark) and the copy buttons.
//
// Loaded in <head> without defer, so the chosen theme is on <html data-theme> before the
// page paints (no flash of the other scheme). "auto" follows the browser's preference
// (dashboard.css: light-dark() under color-scheme); the choice is kept in localStorage.
// A button with data-copy="<selector>" copies the text of that element (a new API
// token): the Clipboard API where the page may use it, else the text is selected for
// Ctrl+C and the button says so.
(function () {
  "use strict";

  var KEY = "durable-theme";
  var NEXT = { auto: "light", light: "dark", dark: "auto" };
  var root = document.documentElement;

  function stored() {
    try {
      var value = window.localStorage.getItem(KEY);
      return NEXT[value] ? value : "auto";
    } catch (e) {
      return "auto"; // storage refused (a private window's policy): the preference
    }
  }

  function apply(theme) {
    if (theme === "auto") root.removeAttribute("data-theme");
    else root.setAttribute("data-theme", theme);
  }

  apply(stored());

  function label(button, theme) {
    button.textContent = "Theme: " + theme;
    button.setAttribute("aria-label", "Theme: " + theme + " (switch to " + NEXT[theme] + ")");
  }

  function copy(button) {
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.textContent;
    var done = function () { button.textContent = "Copied"; };
    var fallback = function () {
      var range = document.createRange();
      range.selectNodeContents(source);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      button.textContent = "Selected: press Ctrl+C";
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, fallback);
    } else {
      fallback();
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var toggle = document.getElementById("theme-toggle");
    if (toggle) {
      label(toggle, stored());
      toggle.addEventListener("click", function () {
        var theme = NEXT[stored()];
        try { window.localStorage.setItem(KEY, theme); } catch (e) { /* this page only */ }
        apply(theme);
        label(toggle, theme);
      });
    }
    document.addEventListener("click", function (evt) {
      var button = evt.target.closest ? evt.target.closest("button[data-copy]") : null;
      if (button) copy(button);
    });
  });
})();
