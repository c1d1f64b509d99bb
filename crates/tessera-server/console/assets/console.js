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
  // A button marked data-copy="#id" copies that element's text and says so.
  document.addEventListener("click", function (ev) {
    var b = ev.target && ev.target.closest ? ev.target.closest("[data-copy]") : null;
    if (!b) return;
    var src = document.querySelector(b.getAttribute("data-copy"));
    var status = document.getElementById(b.getAttribute("aria-describedby") || "");
    if (!src) return;
    var say = function (t) { if (status) status.textContent = t; };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(src.textContent.trim()).then(function () { say("Copied."); }, function () { say("Select the token and copy it."); });
    } else {
      say("Select the token and copy it.");
    }
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
  // The tenants page's quota form: choosing a class fills the fields with its current quota
  // (the options carry it; empty where none is set).
  document.addEventListener("change", function (ev) {
    var sel = ev.target;
    var form = sel && sel.closest ? sel.closest("form[data-quota-form]") : null;
    if (!form || sel.name !== "class") return;
    var opt = sel.options[sel.selectedIndex];
    if (!opt) return;
    form.querySelector("input[name=guaranteed]").value = opt.getAttribute("data-guaranteed") || "";
    form.querySelector("input[name=limit]").value = opt.getAttribute("data-limit") || "";
  });
  // Fleet map: a node's detail opens in a drawer at the viewport's edge, scrolled into view and
  // focused; Escape or its close button closes it and gives focus back to the node's button.
  var drawerOpener = null;
  function closeDrawer() {
    var d = document.getElementById("drawer");
    if (!d || d.hidden) return;
    d.hidden = true;
    if (drawerOpener && document.contains(drawerOpener)) drawerOpener.focus();
  }
  document.addEventListener("htmx:beforeRequest", function (ev) {
    var el = ev.detail.elt;
    if (el && el.hasAttribute && el.hasAttribute("data-opens-drawer")) drawerOpener = el;
  });
  document.addEventListener("htmx:afterSwap", function (ev) {
    var t = ev.detail.target;
    var d = document.getElementById("drawer");
    if (!t || t.id !== "detail" || !d) return;
    d.hidden = false;
    d.scrollTop = 0;
    d.scrollIntoView({ block: "nearest" });
    d.focus();
  });
  document.addEventListener("click", function (ev) {
    if (ev.target && ev.target.closest && ev.target.closest("[data-close-drawer]")) closeDrawer();
  });
  // While the drawer is open, Tab and Shift-Tab cycle through its own controls (it is modal):
  // from the last to the first and back, and from outside (or the drawer itself) into it.
  function focusables(root) {
    return Array.prototype.filter.call(
      root.querySelectorAll("a[href], button:not([disabled]), input:not([disabled]), select:not([disabled]), textarea:not([disabled]), [tabindex]:not([tabindex='-1'])"),
      function (el) { return el.offsetParent !== null || el === document.activeElement; });
  }
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape") { closeDrawer(); return; }
    if (ev.key !== "Tab") return;
    var d = document.getElementById("drawer");
    if (!d || d.hidden) return;
    var items = focusables(d);
    if (!items.length) { ev.preventDefault(); d.focus(); return; }
    var first = items[0], last = items[items.length - 1], at = document.activeElement;
    var inside = d.contains(at) && at !== d;
    if (ev.shiftKey && (!inside || at === first)) { ev.preventDefault(); last.focus(); }
    else if (!ev.shiftKey && (!inside || at === last)) { ev.preventDefault(); first.focus(); }
  });
  // Fleet map: the whole-fleet heat map's `data-heat` (a character per GPU, nodes separated by
  // `,`) drawn as small cells, each node's cells a link to that node in the table.
  function drawHeat() {
    document.querySelectorAll("[data-heat]").forEach(function (el) {
      if (el.dataset.drawn) return;
      el.dataset.drawn = "1";
      var names = el.getAttribute("data-nodes").split(",");
      var href = el.getAttribute("data-href");
      var words = { "0": "free", "1": "partly used", "2": "full", "x": "failed", "h": "highlighted tenant" };
      var frag = document.createDocumentFragment();
      el.getAttribute("data-heat").split(",").forEach(function (gpus, i) {
        var a = document.createElement("a");
        a.className = "heat-node";
        a.href = href + encodeURIComponent(names[i]);
        a.tabIndex = -1;
        a.setAttribute("data-heat-node", "");
        var free = gpus.split("0").length - 1;
        a.setAttribute("aria-label", names[i] + ": " + free + " of " + gpus.length + " GPUs free");
        a.title = names[i] + ": " + free + " of " + gpus.length + " GPUs free";
        for (var k = 0; k < gpus.length; k++) {
          var c = document.createElement("i");
          c.className = "hc h" + gpus[k];
          c.title = "GPU " + k + ": " + (words[gpus[k]] || "");
          a.appendChild(c);
        }
        frag.appendChild(a);
      });
      el.appendChild(frag);
    });
    // One tab stop for the whole map (a roving tabindex): the first node, or the one last moved to.
    var nodes = document.querySelectorAll("[data-heat-node]");
    if (nodes.length && !document.querySelector("[data-heat-node][tabindex='0']")) nodes[0].tabIndex = 0;
  }
  // The heat map by keyboard: Left/Right to the previous/next node, Up/Down to the first node
  // of the previous/next group, Home/End to the first/last node; Enter follows the link.
  document.addEventListener("keydown", function (ev) {
    var a = ev.target && ev.target.closest ? ev.target.closest("[data-heat-node]") : null;
    if (!a) return;
    var all = Array.prototype.slice.call(document.querySelectorAll("[data-heat-node]"));
    var i = all.indexOf(a), to = -1;
    var groupStart = function (g) { return all.indexOf(g.querySelector("[data-heat-node]")); };
    var groups = Array.prototype.slice.call(document.querySelectorAll("[data-heat]"));
    var gi = groups.indexOf(a.parentNode);
    if (ev.key === "ArrowRight") to = Math.min(i + 1, all.length - 1);
    else if (ev.key === "ArrowLeft") to = Math.max(i - 1, 0);
    else if (ev.key === "ArrowDown") to = gi + 1 < groups.length ? groupStart(groups[gi + 1]) : i;
    else if (ev.key === "ArrowUp") to = gi > 0 ? groupStart(groups[gi - 1]) : groupStart(groups[0]);
    else if (ev.key === "Home") to = 0;
    else if (ev.key === "End") to = all.length - 1;
    else return;
    ev.preventDefault();
    if (to < 0) return;
    a.tabIndex = -1;
    all[to].tabIndex = 0;
    all[to].focus();
  });
  document.addEventListener("DOMContentLoaded", drawHeat);
  // Charts: a `data-chart` element holds {title, x: [unix seconds], y: [min, max] (optional,
  // the value axis' fixed range), xRange: [from, to] (optional, unix seconds: the time axis
  // spans the whole window however few points there are), series: [{label, values}]}.
  function drawCharts() {
    if (typeof uPlot === "undefined") return;
    var colours = ["#0b5cad", "#1f6b2e", "#a3001b", "#8a6d00"];
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      if (el.dataset.drawn) return;
      el.dataset.drawn = "1";
      var c = JSON.parse(el.getAttribute("data-chart"));
      var series = [{}].concat(c.series.map(function (s, i) {
        return { label: s.label, stroke: colours[i % colours.length], width: 2 };
      }));
      var data = [c.x].concat(c.series.map(function (s) { return s.values; }));
      var width = Math.max(280, Math.min(el.clientWidth || 800, 1100));
      var opts = { title: c.title, width: width, height: 260, series: series };
      if (c.y || c.xRange) opts.scales = {};
      if (c.y) opts.scales.y = { range: c.y };
      if (c.xRange) opts.scales.x = { time: true, range: c.xRange };
      new uPlot(opts, data, el);
    });
  }
  // The navigation's Menu button on narrow screens (the stylesheet shows it there): the list is
  // folded only once this script runs, so without script every link stays reachable.
  document.documentElement.classList.add("js");
  document.addEventListener("DOMContentLoaded", function () {
    var button = document.querySelector(".menu-toggle");
    var list = document.getElementById("console-nav");
    if (!button || !list) return;
    button.hidden = false;
    button.addEventListener("click", function () {
      var open = list.classList.toggle("open");
      button.setAttribute("aria-expanded", open ? "true" : "false");
    });
  });
  document.addEventListener("DOMContentLoaded", drawCharts);
  document.addEventListener("htmx:afterSettle", drawCharts);
})();
