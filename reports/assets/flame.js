/* Click-to-zoom for the inline-SVG flame graphs (icicle). Hand-written, no dependencies, no network.
   Reads the layout from the rects the server drew; frame names come from each <title>'s first line and
   are set with textContent only (never as markup). */
(function () {
  "use strict";
  function setup(svg) {
    var W = svg.viewBox.baseVal.width - 2;
    var frames = Array.prototype.map.call(svg.querySelectorAll("g.fg"), function (g) {
      var r = g.querySelector("rect");
      var t = g.querySelector("text.frame");
      if (!t) {
        t = document.createElementNS(svg.namespaceURI, "text");
        t.setAttribute("class", "frame");
        t.setAttribute("y", String(+r.getAttribute("y") + +r.getAttribute("height") - 4));
        g.appendChild(t);
      }
      return {g: g, r: r, t: t, x: +r.getAttribute("x"), w: +r.getAttribute("width") + 0.4,
              y: +r.getAttribute("y"), name: g.querySelector("title").textContent.split("\n")[0]};
    });
    function zoom(f) {
      var k = W / f.w;
      frames.forEach(function (o) {
        var inside = o.x >= f.x - 1e-6 && o.x + o.w <= f.x + f.w + 1e-6;
        var above = o.y < f.y && o.x <= f.x + 1e-6 && o.x + o.w >= f.x + f.w - 1e-6;
        var show = (inside && o.y >= f.y) || above;
        o.g.style.display = show ? "" : "none";
        if (!show) return;
        var x = above ? 1 : 1 + (o.x - f.x) * k, w = above ? W : o.w * k;
        o.r.setAttribute("x", x.toFixed(1));
        o.r.setAttribute("width", Math.max(w - 0.4, 0.3).toFixed(1));
        o.g.style.opacity = above ? "0.6" : "";
        var chars = Math.floor((w - 6) / 6.3);
        o.t.setAttribute("x", (x + 3).toFixed(1));
        o.t.textContent = chars < 3 ? "" : (o.name.length <= chars ? o.name : o.name.slice(0, chars - 1) + "\u2026");
      });
    }
    frames.forEach(function (f) {
      f.g.style.cursor = "pointer";
      f.g.addEventListener("click", function () { zoom(f); });
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("svg.flamegraph"), setup);
})();
