// Tessera console: the little behaviour htmx does not give. Loaded with `defer`, no inline
// script anywhere (the Content-Security-Policy forbids it).
"use strict";
(function () {
  // A refused htmx request (problem+json) is shown in the page's alert region.
  document.addEventListener("htmx:responseError", function (ev) {
    var flash = document.getElementById("flash");
    if (!flash) return;
    var text = ev.detail.xhr.statusText || "request failed";
    try {
      var p = JSON.parse(ev.detail.xhr.responseText);
      text = p.detail || p.title || text;
    } catch (e) { /* not a problem document */ }
    flash.textContent = text;
    flash.hidden = false;
  });
  // Buttons marked data-reload reload the page once their request succeeded.
  document.addEventListener("htmx:afterRequest", function (ev) {
    var el = ev.detail.elt;
    if (ev.detail.successful && el && el.hasAttribute && el.hasAttribute("data-reload")) {
      window.location.reload();
    }
  });
  // A preview describes the form as it was: changing a field withdraws it (and its submit
  // button), so what is submitted is always what was previewed.
  document.addEventListener("change", function (ev) {
    var form = ev.target && ev.target.closest ? ev.target.closest("form#request") : null;
    var preview = document.getElementById("preview");
    if (form && preview) preview.remove();
  });
})();
