// memprobe run --html: the run's report drawn on canvases, from the JSON
// document embedded in the page (no network, no library). Panels: the
// process tree (its summed RSS, each followed process's line, the phases as
// bands, OOM kills marked), the container, each GPU. Wheel or drag zooms,
// double-click shows the whole run; hovering a phase shows its exact peaks.
(function () {
  "use strict";
  var t0 = performance.now();
  var doc = JSON.parse(document.getElementById("memprobe-data").textContent);
  var TOP = 8; // process lines shown at first; the rest under "others"
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];

  function bytes(b) {
    if (b === null || b === undefined) return "-";
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b.toFixed(0) : b.toFixed(b < 10 ? 2 : b < 100 ? 1 : 0)) + " " + u[i];
  }
  function secs(s) {
    if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
    if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms";
    if (s < 120) return s.toFixed(s < 10 ? 3 : 2) + " s";
    if (s < 7200) return (s / 60).toFixed(2) + " min";
    return (s / 3600).toFixed(2) + " h";
  }
  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }

  // --- the data, as columns -------------------------------------------------
  var tl = doc.timeline || [];
  var n = tl.length;
  var T = new Float64Array(n), TREE = new Float64Array(n), CG = new Float64Array(n);
  var hasCg = false;
  var gpuCount = (doc.gpus || []).length;
  var GPU = [];
  for (var g = 0; g < gpuCount; g++) GPU.push(new Float64Array(n));
  for (var i = 0; i < n; i++) {
    var p = tl[i];
    T[i] = p.t_s;
    TREE[i] = p.tree_rss_bytes;
    if (p.cgroup_bytes !== undefined && p.cgroup_bytes !== null) { CG[i] = p.cgroup_bytes; hasCg = true; } else CG[i] = NaN;
    for (g = 0; g < gpuCount; g++) {
      var v = p.gpu_used_bytes ? p.gpu_used_bytes[g] : null;
      GPU[g][i] = v === null || v === undefined ? NaN : v;
    }
  }
  var end = Math.max(doc.duration_s || 0, n ? T[n - 1] : 0) || 1;
  var lines = ((doc.process_lines || {}).lines || []).map(function (l, k) {
    var pts = l.rss_points || [];
    var t = new Float64Array(pts.length), y = new Float64Array(pts.length);
    for (var j = 0; j < pts.length; j++) { t[j] = pts[j][0]; y[j] = pts[j][1]; }
    return { pid: l.pid, name: l.name, peak: l.peak_rss_bytes, t: t, y: y,
      color: COLORS[(k + 1) % COLORS.length], shown: k < TOP };
  });
  // A breakdown by origin as words: "name bytes, ..." (largest first).
  function originWords(o) {
    return o.by_origin.map(function (x) {
      return x.name + " " + bytes(x.bytes) + (x.symbol ? " (" + x.symbol + ")" : "");
    }).join(", ");
  }
  // A PyTorch attribution record's top blocks as words.
  function blockWords(r, n) {
    if (!r.history.complete) return "blocks unknown: " + (r.history.reason || "torch's history lost entries");
    var w = r.blocks.slice(0, n).map(function (b) {
      var f = b.frames[0];
      var at = f ? f.file.split("/").pop() + ":" + f.line + " " + f.function : (b.module ? "backward of " + b.module : "no frame");
      return bytes(b.bytes) + " " + at;
    });
    if (r.rest.blocks) w.push("rest " + bytes(r.rest.bytes || 0) + " in " + r.rest.blocks + " blocks");
    return w.join(", ");
  }
  var torch = doc.torch_attribution || [];
  var phases = (doc.phases || []).map(function (ph, k) {
    var exact = (ph.sources || []).map(function (s) {
      return s.name + " " + bytes(s.peak_bytes) + " (" + s.fidelity + ")";
    });
    // With --gpu-exact: what held the tree's GPU memory at the phase's peak.
    ((ph.run || {}).gpu_origins_at_peak || []).forEach(function (o, dev) {
      if (o) exact.push("GPU " + dev + " " + bytes(o.peak_bytes) + " (exact, tree) held by " + originWords(o));
    });
    // An epoch's peak step and its largest PyTorch blocks.
    if (ph.kind === "epoch") {
      torch.forEach(function (r) {
        if (r.kind === "epoch_peak" && r.epoch === ph.index && (ph.rank === undefined || ph.rank === r.rank)) {
          exact.push("torch peak step " + r.step + ": " + bytes(r.peak_bytes) + " = " + blockWords(r, 3));
        }
      });
    }
    return { k: k, label: ph.label, kind: ph.kind, depth: ph.depth || 0, a: ph.start_s,
      b: ph.end_s === null || ph.end_s === undefined ? end : ph.end_s, open: !ph.ended,
      tree: ph.run ? ph.run.tree_peak_bytes : null, exact: exact };
  });
  // Outermost phases first, then by start: bands drawn under the nested ones.
  phases.sort(function (x, y) { return x.depth - y.depth || x.a - y.a; });
  var marks = [];
  ((doc.oom_kill || {}).victims || []).forEach(function (v) {
    if (v.at_s !== null && v.at_s !== undefined)
      marks.push({ t: v.at_s, color: "#c80000", text: "OOM kill: pid " + v.pid + " (" + v.name + ")" });
  });
  (((doc.gpu_exact || {}).processes) || []).forEach(function (p) {
    if (p.last_oom_at_s !== null && p.last_oom_at_s !== undefined)
      marks.push({ t: p.last_oom_at_s, color: "#7828a0", text: "GPU out of memory: pid " + p.pid });
  });

  // --- panels ----------------------------------------------------------------
  var view = { x0: 0, x1: end };
  var panels = [];
  function series(name, t, y, color, width) { return { name: name, t: t, y: y, color: color, width: width || 1.5 }; }
  panels.push({ id: "tree", title: "process tree (RSS)", bands: true, marks: true,
    series: function () {
      var s = [series("tree RSS", T, TREE, "#000", 2)];
      lines.forEach(function (l) { if (l.shown) s.push(series("pid " + l.pid + " " + l.name, l.t, l.y, l.color, 1.2)); });
      return s;
    }, limit: null });
  if (hasCg) {
    panels.push({ id: "container", title: "container (cgroup " + ((doc.cgroup || {}).version || "") + ")",
      series: function () { return [series("container", T, CG, "#2ca02c", 1.5)]; },
      limit: (doc.cgroup || {}).limit_bytes || null, marks: true });
  }
  (doc.gpus || []).forEach(function (gd, g) {
    panels.push({ id: "gpu" + g, title: "GPU " + gd.index + ": " + gd.name,
      series: function () { return [series("GPU " + gd.index, T, GPU[g], "#76b900", 1.5)]; },
      limit: gd.total_bytes || null, marks: true });
  });

  var root = document.getElementById("panels");
  var tip = document.getElementById("tip");
  panels.forEach(function (pl) {
    var box = document.createElement("section");
    box.className = "panel";
    box.id = "panel-" + pl.id;
    box.innerHTML = "<h2>" + esc(pl.title) + "</h2>";
    var c = document.createElement("canvas");
    box.appendChild(c);
    root.appendChild(box);
    pl.canvas = c;
    pl.height = pl.id === "tree" ? 300 : 160;
    attach(pl);
  });

  // --- drawing ---------------------------------------------------------------
  var PAD_L = 70, PAD_R = 12, PAD_T = 8, PAD_B = 22;
  function lowerBound(a, x) {
    var lo = 0, hi = a.length;
    while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] < x) lo = m + 1; else hi = m; }
    return lo;
  }
  function niceStep(span, count) {
    var raw = span / count, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
  }
  // Each series reduced to one min-max pair per pixel column: no peak is
  // ever dropped, however many points a column holds.
  function columns(s, w, x0, x1) {
    var a = Math.max(0, lowerBound(s.t, x0) - 1), b = Math.min(s.t.length, lowerBound(s.t, x1) + 1);
    var out = [], col = -1, lo = 0, hi = 0, k = 0, sx = w / (x1 - x0);
    for (var j = a; j < b; j++) {
      var v = s.y[j];
      if (v !== v) continue; // NaN: not measured
      var c = Math.floor((s.t[j] - x0) * sx);
      if (c !== col) {
        if (col !== -1 || k) out.push([col, lo, hi]);
        col = c; lo = hi = v; k = 1;
      } else { if (v < lo) lo = v; if (v > hi) hi = v; }
    }
    if (k) out.push([col, lo, hi]);
    return out;
  }
  function draw(pl) {
    var c = pl.canvas, dpr = window.devicePixelRatio || 1;
    var W = Math.max(300, c.parentNode.clientWidth - 2), H = pl.height;
    c.style.width = W + "px"; c.style.height = H + "px";
    c.width = Math.round(W * dpr); c.height = Math.round(H * dpr);
    var ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, H);
    var w = W - PAD_L - PAD_R, h = H - PAD_T - PAD_B;
    var x0 = view.x0, x1 = view.x1;
    var ss = pl.series(), cols = [], ymax = pl.limit && pl.id !== "tree" ? 0 : 0;
    ss.forEach(function (s) {
      var cs = columns(s, w, x0, x1);
      cols.push(cs);
      for (var j = 0; j < cs.length; j++) if (cs[j][2] > ymax) ymax = cs[j][2];
    });
    if (pl.limit && pl.limit < ymax * 4) ymax = Math.max(ymax, pl.limit);
    ymax = ymax > 0 ? ymax * 1.08 : 1;
    var X = function (t) { return PAD_L + (t - x0) / (x1 - x0) * w; };
    var Y = function (v) { return PAD_T + h - v / ymax * h; };
    pl.geom = { w: w, h: h, X: X, Y: Y, ymax: ymax, W: W };
    // Phases as bands, nested ones darker.
    pl.bandsDrawn = 0;
    if (pl.bands) {
      for (var q = 0; q < phases.length; q++) {
        var ph = phases[q];
        if (ph.b < x0 || ph.a > x1) continue;
        var xa = Math.max(PAD_L, X(ph.a)), xb = Math.min(PAD_L + w, X(ph.b));
        if (xb - xa < 0.5) continue;
        ctx.fillStyle = ph.kind === "epoch" ? (ph.k % 2 ? "rgba(31,119,180,0.10)" : "rgba(31,119,180,0.17)")
          : "rgba(255,127,14," + (0.10 + 0.05 * Math.min(ph.depth, 3)) + ")";
        ctx.fillRect(xa, PAD_T, xb - xa, h);
        pl.bandsDrawn++;
      }
    }
    // Axes.
    ctx.strokeStyle = "#999"; ctx.fillStyle = "#333"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(PAD_L, PAD_T); ctx.lineTo(PAD_L, PAD_T + h); ctx.lineTo(PAD_L + w, PAD_T + h); ctx.stroke();
    var ys = niceStep(ymax, 4);
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    for (var yv = 0; yv <= ymax; yv += ys) {
      ctx.fillText(bytes(yv), PAD_L - 4, Y(yv));
      ctx.strokeStyle = "#eee"; ctx.beginPath(); ctx.moveTo(PAD_L + 1, Y(yv)); ctx.lineTo(PAD_L + w, Y(yv)); ctx.stroke();
    }
    var xs = niceStep(x1 - x0, Math.max(2, Math.floor(w / 110)));
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (var xv = Math.ceil(x0 / xs) * xs; xv <= x1; xv += xs) ctx.fillText(secs(xv), X(xv), PAD_T + h + 4);
    if (pl.limit) {
      ctx.strokeStyle = "#c00"; ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(PAD_L, Y(pl.limit)); ctx.lineTo(PAD_L + w, Y(pl.limit)); ctx.stroke();
      ctx.setLineDash([]);
    }
    // The series: each pixel column its min and max joined.
    ctx.save();
    ctx.beginPath(); ctx.rect(PAD_L, PAD_T, w, h); ctx.clip();
    pl.linesDrawn = [];
    ss.forEach(function (s, si) {
      var cs = cols[si];
      if (!cs.length) return;
      pl.linesDrawn.push(s.name);
      ctx.strokeStyle = s.color; ctx.lineWidth = s.width; ctx.beginPath();
      for (var j = 0; j < cs.length; j++) {
        var px = PAD_L + cs[j][0] + 0.5;
        if (j === 0) ctx.moveTo(px, Y(cs[j][1])); else ctx.lineTo(px, Y(cs[j][1]));
        if (cs[j][2] !== cs[j][1]) ctx.lineTo(px, Y(cs[j][2]));
      }
      ctx.stroke();
      if (cs.length === 1) { ctx.fillStyle = s.color; ctx.fillRect(PAD_L + cs[0][0] - 1, Y(cs[0][2]) - 1, 3, 3); }
    });
    pl.marksDrawn = 0;
    if (pl.marks) {
      marks.forEach(function (m) {
        if (m.t < x0 || m.t > x1) return;
        ctx.strokeStyle = m.color; ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(X(m.t), PAD_T); ctx.lineTo(X(m.t), PAD_T + h); ctx.stroke();
        pl.marksDrawn++;
      });
    }
    ctx.restore();
  }
  function drawAll() {
    panels.forEach(draw);
    document.getElementById("range").textContent =
      secs(view.x0) + " – " + secs(view.x1) + " (" + secs(view.x1 - view.x0) + " shown)";
  }
  function setRange(a, b) {
    var min = 1e-6;
    if (b - a < min) { var m = (a + b) / 2; a = m - min / 2; b = m + min / 2; }
    view.x0 = Math.max(0, a); view.x1 = Math.min(end, b);
    if (view.x1 <= view.x0) { view.x0 = 0; view.x1 = end; }
    drawAll();
  }

  // --- interaction -------------------------------------------------------------
  function timeAt(pl, clientX) {
    var r = pl.canvas.getBoundingClientRect();
    var f = (clientX - r.left - PAD_L) / pl.geom.w;
    return view.x0 + Math.min(1, Math.max(0, f)) * (view.x1 - view.x0);
  }
  function phaseAt(t) {
    // The innermost (shortest) phase holding t.
    var best = null;
    for (var q = 0; q < phases.length; q++) {
      var ph = phases[q];
      if (ph.a <= t && t <= ph.b && (!best || ph.b - ph.a < best.b - best.a)) best = ph;
    }
    return best;
  }
  function valueAt(s, t) {
    var j = lowerBound(s.t, t);
    if (j >= s.t.length) j = s.t.length - 1;
    if (j > 0 && t - s.t[j - 1] < s.t[j] - t) j--;
    return j >= 0 ? s.y[j] : NaN;
  }
  function attach(pl) {
    var c = pl.canvas, drag = null;
    c.addEventListener("wheel", function (e) {
      e.preventDefault();
      var t = timeAt(pl, e.clientX), f = e.deltaY < 0 ? 0.8 : 1.25;
      setRange(t - (t - view.x0) * f, t + (view.x1 - t) * f);
    }, { passive: false });
    c.addEventListener("mousedown", function (e) { drag = timeAt(pl, e.clientX); });
    c.addEventListener("mouseup", function (e) {
      if (drag === null) return;
      var t = timeAt(pl, e.clientX), a = Math.min(drag, t), b = Math.max(drag, t);
      drag = null;
      if (b - a > (view.x1 - view.x0) / 500) setRange(a, b);
    });
    c.addEventListener("dblclick", function () { setRange(0, end); });
    c.addEventListener("mouseleave", function () { tip.hidden = true; });
    c.addEventListener("mousemove", function (e) {
      var t = timeAt(pl, e.clientX), rows = ["<b>" + secs(t) + "</b>"];
      pl.series().forEach(function (s) {
        var v = valueAt(s, t);
        if (v === v) rows.push(esc(s.name) + ": " + bytes(v));
      });
      if (pl.bands) {
        var ph = phaseAt(t);
        if (ph) {
          rows.push("<hr><b>" + esc(ph.label) + "</b> " + secs(ph.a) + " – " + (ph.open ? "open" : secs(ph.b)));
          if (ph.tree !== null && ph.tree !== undefined) rows.push("tree peak " + bytes(ph.tree) + " (sampled)");
          ph.exact.forEach(function (x) { rows.push("peak " + esc(x)); });
        }
      }
      marks.forEach(function (m) {
        if (Math.abs(pl.geom.X(m.t) - pl.geom.X(t)) < 4) rows.push("<b style='color:" + m.color + "'>" + esc(m.text) + "</b>");
      });
      tip.innerHTML = rows.join("<br>");
      tip.hidden = false;
      tip.style.left = Math.min(e.pageX + 14, window.innerWidth - 320) + "px";
      tip.style.top = e.pageY + 14 + "px";
    });
  }
  document.getElementById("reset").addEventListener("click", function () { setRange(0, end); });

  // Process toggles: the largest TOP on, the rest under "others".
  var tg = document.getElementById("toggles");
  function toggle(l, on) {
    var box = document.createElement("label");
    box.innerHTML = "<input type='checkbox' data-pid='" + l.pid + "'" + (l.shown ? " checked" : "") +
      "><span class='sw' style='background:" + l.color + "'></span>pid " + l.pid + " " + esc(l.name) +
      " (peak " + bytes(l.peak) + ")";
    box.firstChild.addEventListener("change", function (e) { l.shown = e.target.checked; draw(panels[0]); });
    on.appendChild(box);
  }
  var top = document.createElement("div");
  lines.slice(0, TOP).forEach(function (l) { toggle(l, top); });
  tg.appendChild(top);
  if (lines.length > TOP) {
    var rest = lines.slice(TOP);
    var det = document.createElement("details");
    det.innerHTML = "<summary><label><input type='checkbox' id='others'> others (" + rest.length + ")</label></summary>";
    var inner = document.createElement("div");
    rest.forEach(function (l) { toggle(l, inner); });
    det.appendChild(inner);
    tg.appendChild(det);
    document.getElementById("others").addEventListener("change", function (e) {
      rest.forEach(function (l) { l.shown = e.target.checked; });
      inner.querySelectorAll("input").forEach(function (x) { x.checked = e.target.checked; });
      draw(panels[0]);
    });
  }
  // Ranks: a process's own (sent by its tracker) or its nearest
  // ancestor's (a DataLoader worker is its rank's). One toggle per rank.
  var procs = {};
  (doc.processes || []).forEach(function (p) { procs[p.pid] = p; });
  function rankOf(pid) {
    for (var hops = 0; pid !== null && pid !== undefined && procs[pid] && hops < 64; hops++) {
      if (procs[pid].rank !== undefined && procs[pid].rank !== null) return procs[pid].rank;
      pid = procs[pid].ppid;
    }
    return null;
  }
  var ranks = {};
  lines.forEach(function (l) {
    l.rank = rankOf(l.pid);
    if (l.rank !== null) (ranks[l.rank] = ranks[l.rank] || []).push(l);
  });
  var rankIds = Object.keys(ranks).map(Number).sort(function (a, b) { return a - b; });
  if (rankIds.length) {
    var rk = document.createElement("div");
    rk.id = "ranks";
    rk.appendChild(document.createTextNode("ranks: "));
    rankIds.forEach(function (r) {
      var box = document.createElement("label");
      var on = ranks[r].some(function (l) { return l.shown; });
      box.innerHTML = "<input type='checkbox' data-rank='" + r + "'" + (on ? " checked" : "") + ">rank " + r +
        " (" + ranks[r].length + " line" + (ranks[r].length === 1 ? "" : "s") + ")";
      box.firstChild.addEventListener("change", function (e) {
        ranks[r].forEach(function (l) {
          l.shown = e.target.checked;
          var x = tg.querySelector("input[data-pid='" + l.pid + "']");
          if (x) x.checked = e.target.checked;
        });
        draw(panels[0]);
      });
      rk.appendChild(box);
    });
    tg.insertBefore(rk, tg.firstChild);
  }
  var seen = (doc.process_lines || {}).processes_seen;
  if (seen !== undefined && seen > lines.length) {
    var note = document.createElement("p");
    note.textContent = (seen - lines.length) + " more processes ran, too small to be followed as lines; the tree's sum counts them.";
    tg.appendChild(note);
  }
  // With --gpu-exact and origins: what held each process's GPU memory at
  // its exact peak on each device (by CUDA ordinal).
  var held = [];
  (((doc.gpu_exact || {}).devices) || []).forEach(function (d) {
    var o = d.origins_at_tree_peak;
    if (o && o.by_origin.length) {
      held.push("<li>all processes, device " + d.index + ": peak " + bytes(o.peak_bytes) +
        (o.phase ? " in " + esc(o.phase) : "") + " = " + esc(originWords(o)) + "</li>");
    } else if (d.origins_at_tree_peak_unknown) {
      held.push("<li>all processes, device " + d.index + ": peak " + bytes(d.tree_peak_bytes) +
        " by origin unknown: " + esc(d.origins_at_tree_peak_unknown) + "</li>");
    }
  });
  (((doc.gpu_exact || {}).processes) || []).forEach(function (p) {
    (p.origins_at_peak || []).forEach(function (o, dev) {
      if (!o || !o.by_origin || !o.by_origin.length) return;
      held.push("<li>pid " + p.pid + ", device " + dev + ": peak " + bytes(o.peak_bytes) + " = " +
        o.by_origin.map(function (x) {
          return esc(x.name) + " " + bytes(x.bytes) + (x.symbol ? " (" + esc(x.symbol) + ")" : "");
        }).join(", ") + "</li>");
    });
  });
  if (held.length) {
    var sec = document.createElement("section");
    sec.id = "origins";
    sec.innerHTML = "<h2>GPU memory at each exact peak, by origin</h2><ul>" + held.join("") + "</ul>";
    root.appendChild(sec);
  }
  // PyTorch's live blocks at each epoch's peak step and at each OOM.
  if (torch.length) {
    var ts = document.createElement("section");
    ts.id = "torch";
    ts.innerHTML = "<h2>PyTorch's largest live blocks at each epoch's peak step</h2><ul>" +
      torch.map(function (r) {
        var what = r.kind === "oom" ? "out of memory asking " + bytes(r.requested_bytes) : "epoch " + r.epoch + " peak";
        return "<li>rank " + r.rank + ", " + esc(what) + (r.step !== null ? ", step " + r.step : "") +
          (r.peak_bytes !== null ? ": " + bytes(r.peak_bytes) : "") + " = " + esc(blockWords(r, 10)) + "</li>";
      }).join("") + "</ul>";
    root.appendChild(ts);
  }
  window.addEventListener("resize", drawAll);
  drawAll();

  // For tests and for the console: what is drawn, and the view.
  window.memprobeReport = {
    panels: panels.map(function (p) { return p.id; }),
    origins: held.length,
    torch: torch.length,
    ranks: rankIds,
    range: function () { return [view.x0, view.x1]; },
    setRange: setRange,
    drawn: function () {
      return panels.map(function (p) { return { id: p.id, lines: p.linesDrawn.slice(), bands: p.bandsDrawn, marks: p.marksDrawn }; });
    },
    ms: performance.now() - t0
  };
})();
