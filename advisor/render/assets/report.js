/* advisor report: sortable tables and timeline zoom. Touches the DOM only through
   textContent/attributes (never innerHTML), so data in the page stays data. */
(function () {
  "use strict";
  function cellKey(td, numeric) {
    var v = td.getAttribute("data-v");
    if (v === null) { v = td.textContent; }
    if (numeric) { var f = parseFloat(v); return isNaN(f) ? -Infinity : f; }
    return v.toLowerCase();
  }
  function sortTable(table, col, th) {
    var numeric = th.getAttribute("data-type") === "num";
    var current = th.getAttribute("aria-sort");
    var descending = current ? current === "ascending" : numeric;
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellKey(a.cells[col], numeric), y = cellKey(b.cells[col], numeric);
      var c = x < y ? -1 : (x > y ? 1 : 0);
      return descending ? -c : c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.tabIndex = 0;
      th.addEventListener("click", function () { sortTable(table, col, th); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortTable(table, col, th); }
      });
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll(".tl"), function (tl) {
    var scroll = tl.querySelector(".tl-scroll"), body = tl.querySelector(".tl-body");
    var zoom = 1;
    Array.prototype.forEach.call(tl.querySelectorAll("button[data-zoom]"), function (btn) {
      btn.addEventListener("click", function () {
        var z = parseInt(btn.getAttribute("data-zoom"), 10);
        var centre = (scroll.scrollLeft + scroll.clientWidth / 2) / (scroll.scrollWidth || 1);
        tl.classList.remove("zoom-" + zoom);
        zoom = z;
        tl.classList.add("zoom-" + zoom);
        body.setAttribute("width", (100 * z) + "%");
        scroll.scrollLeft = centre * scroll.scrollWidth - scroll.clientWidth / 2;
        Array.prototype.forEach.call(tl.querySelectorAll("button[data-zoom]"), function (b) {
          b.setAttribute("aria-pressed", b === btn ? "true" : "false");
        });
      });
    });
  });
  document.documentElement.setAttribute("data-report-ready", "1");
})();
