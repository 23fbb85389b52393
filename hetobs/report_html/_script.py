"""The page's one inline script: draws the ring, the zoom, the timeline, the arrival and bandwidth charts.

Why a script and not pre-drawn SVG: the reader zooms into any rank of a 4,096-rank
ring without the file holding 4,096 pictures. It reads only the JSON data block
(model.py) and writes text with `textContent` / `setAttribute`, never innerHTML, so
text from dumps cannot become markup. Kept free of interpolation: the page's
Content-Security-Policy allows exactly this text (by its hash) and nothing else.
"""

SCRIPT = r"""
(function () {
"use strict";
var started = performance.now();
var NS = "http://www.w3.org/2000/svg";
var D = JSON.parse(document.getElementById("hetobs-data").textContent);
var S = D.strings, R = D.ranks, N = D.world, ORDER = D.order;
var COLORS = {in_op: "#4e79a7", idle: "#a0cbe8", done: "#59a14f", exited: "#59a14f", not_joined: "#f28e2b",
  failed: "#e15759", dead: "#7b0c0c", stopped: "#b07aa1", silent: "#b07aa1", no_dump: "#bab0ac",
  unknown: "#d7d7d7"};
var BLAME = "#d62728";
var blamed = {}, advisory = {}, posOf = {};
D.blamed.forEach(function (r) { blamed[r] = true; });
D.advisory.forEach(function (r) { advisory[r] = true; });
ORDER.forEach(function (r, i) { posOf[r] = i; });
var linkKey = {};
D.blamed_links.forEach(function (l) { linkKey[l[0] + ">" + l[1]] = true; });

function el(tag, attrs, parent) {
  var e = document.createElementNS(NS, tag);
  for (var k in attrs) { e.setAttribute(k, String(attrs[k])); }
  if (parent) { parent.appendChild(e); }
  return e;
}
function h(tag, text, parent, cls) {
  var e = document.createElement(tag);
  if (text !== null && text !== undefined) { e.textContent = String(text); }
  if (cls) { e.className = cls; }
  if (parent) { parent.appendChild(e); }
  return e;
}
function svg(w, ht, parent) {
  return el("svg", {width: w, height: ht, viewBox: "0 0 " + w + " " + ht, role: "img"}, parent);
}
function text(parent, x, y, s, attrs) {
  var t = el("text", Object.assign({x: x, y: y}, attrs || {}), parent);
  t.textContent = String(s);
  return t;
}
function tip(node, s) { var t = el("title", {}, node); t.textContent = s; }
function str(col, r) { var i = R[col][r]; return (i === undefined || i < 0) ? null : S[col][i]; }
function stateOf(r) { return str("state", r) || "unknown"; }
function color(st) { return COLORS[st] || "#8c8c8c"; }
function short(s, n) { s = String(s); return s.length > n ? s.slice(0, n - 1) + "\u2026" : s; }
function fmtMs(ms) {
  var a = Math.abs(ms);
  if (a < 1e-6) { return "0"; }
  if (a >= 1000) { return (ms / 1000).toFixed(a >= 10000 ? 1 : 2) + " s"; }
  if (a >= 1) { return ms.toFixed(a >= 100 ? 0 : 1) + " ms"; }
  return (ms * 1000).toFixed(0) + " \u00b5s";
}
function fmtBytes(b) {
  if (b === null || b === undefined) { return "?"; }
  var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + " " + u[i];
}
function rankInfo(r) {
  var parts = ["rank " + r, stateOf(r)];
  var host = str("host", r), isl = str("island", r), op = str("op", r), ph = str("phase", r), wh = str("where", r);
  if (blamed[r]) { parts.push("BLAMED"); }
  if (host) { parts.push("host " + host); }
  if (isl) { parts.push("island " + isl); }
  if (op) { parts.push(op + (R.seq[r] !== null ? " seq " + R.seq[r] : "")); }
  if (ph) { parts.push("phase " + ph); }
  if (R.waiting[r] && R.waiting[r].length) { parts.push("waiting on " + R.waiting[r].join(", ")); }
  if (wh) { parts.push("in Python: " + wh); }
  return parts.join(" \u00b7 ");
}

// --- the ring: one tick (or one arc per run of equal state) per rank --------------------------
function drawRing(box) {
  var n = ORDER.length;
  if (!n) { h("p", "no ranks to draw", box); return; }
  var W = 580, C = W / 2, RR = 180;
  var s = svg(W, W, box);
  s.setAttribute("id", "ring-svg");
  function ang(i) { return -Math.PI / 2 + 2 * Math.PI * i / n; }
  function pt(i, rad) { var a = ang(i); return [C + rad * Math.cos(a), C + rad * Math.sin(a)]; }
  function arc(i, j, rad, attrs) {
    if (j - i >= n) { return el("circle", Object.assign({cx: C, cy: C, r: rad, fill: "none"}, attrs), s); }
    var p1 = pt(i, rad), p2 = pt(j, rad), large = (j - i) * 2 > n ? 1 : 0;
    return el("path", Object.assign({d: "M" + p1[0].toFixed(2) + " " + p1[1].toFixed(2) + " A" + rad + " " + rad +
      " 0 " + large + " 1 " + p2[0].toFixed(2) + " " + p2[1].toFixed(2), fill: "none"}, attrs), s);
  }
  if (n <= 128) {
    el("circle", {cx: C, cy: C, r: RR, fill: "none", stroke: "#ccc", "stroke-width": 2}, s);
    var rad = Math.max(3, Math.min(14, Math.PI * RR / n * 0.7));
    ORDER.forEach(function (r, i) {
      var p = pt(i + 0.5, RR);
      var c = el("circle", {cx: p[0].toFixed(2), cy: p[1].toFixed(2), r: rad.toFixed(2), fill: color(stateOf(r)),
        stroke: blamed[r] ? BLAME : (advisory[r] ? "#f28e2b" : "#ffffff"), "stroke-width": blamed[r] ? 4 : 1.5,
        "class": "rank", "data-rank": r}, s);
      tip(c, rankInfo(r));
      c.addEventListener("click", function () { zoomTo(r); });
      if (n <= 32) { var q = pt(i + 0.5, RR - rad - 12); text(s, q[0], q[1] + 4, r, {"text-anchor": "middle", "class": "small"}); }
    });
  } else {
    var i = 0;
    while (i < n) {
      var st = stateOf(ORDER[i]), j = i + 1;
      while (j < n && stateOf(ORDER[j]) === st) { j++; }
      var a = arc(i, j, RR, {stroke: color(st), "stroke-width": 22});
      tip(a, (j - i) + " rank(s) " + st + ": ranks " + ORDER[i] + (j - i > 1 ? " \u2026 " + ORDER[j - 1] : "") +
        " in ring order");
      i = j;
    }
    var hit = el("circle", {cx: C, cy: C, r: RR, fill: "none", stroke: "transparent", "stroke-width": 30,
      "pointer-events": "stroke", "class": "hit"}, s);
    var rankAt = function (ev) {
      var b = s.getBoundingClientRect();
      var x = (ev.clientX - b.left) * W / b.width - C, y = (ev.clientY - b.top) * W / b.height - C;
      var a = Math.atan2(y, x) + Math.PI / 2; if (a < 0) { a += 2 * Math.PI; }
      return ORDER[Math.min(n - 1, Math.floor(a / (2 * Math.PI) * n))];
    };
    hit.addEventListener("mousemove", function (ev) { document.getElementById("ring-hover").textContent = rankInfo(rankAt(ev)); });
    hit.addEventListener("click", function (ev) { zoomTo(rankAt(ev)); });
  }
  // Islands as groups: an outer arc per run of one island, named at its middle.
  var anyIsland = R.island.some(function (x) { return x >= 0; });
  if (anyIsland) {
    var k = 0, shade = ["#555", "#999"];
    var g = 0;
    while (k < n) {
      var isl = R.island[ORDER[k]], m = k + 1;
      while (m < n && R.island[ORDER[m]] === isl) { m++; }
      var name = isl >= 0 ? S.island[isl] : "(no island)";
      var ia = arc(k + 0.08, m - 0.08, RR + 62, {stroke: shade[g % 2], "stroke-width": 6, "class": "island"});
      tip(ia, "island " + name + ": " + (m - k) + " rank(s)");
      var mid = pt((k + m) / 2, RR + 76);
      text(s, mid[0], mid[1] + 4, short(name, 16), {"text-anchor": "middle", "class": "island-name"});
      k = m; g++;
    }
  }
  // The blamed: a red mark and a name outside the ring; blamed links as red chords.
  D.blamed_links.forEach(function (l) {
    if (posOf[l[0]] === undefined || posOf[l[1]] === undefined) { return; }
    var p = pt(posOf[l[0]] + 0.5, RR - 20), q = pt(posOf[l[1]] + 0.5, RR - 20);
    var ln = el("line", {x1: p[0], y1: p[1], x2: q[0], y2: q[1], stroke: BLAME, "stroke-width": 5,
      "class": "blamed-link"}, s);
    tip(ln, "blamed link " + l[0] + " \u2192 " + l[1]);
    var m = pt((posOf[l[0]] + posOf[l[1]] + 1) / 2, RR - 40);
    text(s, m[0], m[1], "link " + l[0] + "\u2192" + l[1], {"text-anchor": "middle", "class": "blame-label"});
  });
  var marks = D.blamed.concat(D.advisory).filter(function (r) { return posOf[r] !== undefined; });
  marks.slice(0, 12).forEach(function (r) {
    var i = posOf[r], p = pt(i + 0.5, RR + 22), q = pt(i + 0.5, RR + 40), t1 = pt(i + 0.5, RR - 14), t2 = pt(i + 0.5, RR + 14);
    if (n > 128) {  // one rank's arc is too thin to see at this scale: a tick across the ring marks it
      el("line", {x1: t1[0], y1: t1[1], x2: t2[0], y2: t2[1], stroke: blamed[r] ? BLAME : "#f28e2b", "stroke-width": 3}, s);
    }
    var c = el("circle", {cx: p[0], cy: p[1], r: 6, fill: blamed[r] ? BLAME : "#f28e2b", "class": "blamed-mark"}, s);
    tip(c, rankInfo(r));
    c.addEventListener("click", function () { zoomTo(r); });
    text(s, q[0], q[1] + 4, "rank " + r, {"text-anchor": q[0] < C - 5 ? "end" : (q[0] > C + 5 ? "start" : "middle"),
      "class": "blame-label"});
  });
  if (marks.length > 12) { text(s, C, C + 40, "+" + (marks.length - 12) + " more blamed", {"text-anchor": "middle"}); }
  text(s, C, C - 6, N + " ranks", {"text-anchor": "middle", "class": "big"});
  text(s, C, C + 16, D.comm !== null ? "comm " + D.comm + (anyIsland ? ", grouped by island" : ", ring order")
    : "rank order", {"text-anchor": "middle", "class": "small"});
}

function drawLegend(box) {
  var counts = {};
  for (var r = 0; r < N; r++) { var st = stateOf(r); counts[st] = (counts[st] || 0) + 1; }
  Object.keys(counts).sort(function (a, b) { return counts[b] - counts[a]; }).forEach(function (st) {
    var item = h("span", null, box, "legend-item");
    var sw = svg(12, 12, item); el("rect", {width: 12, height: 12, fill: color(st)}, sw);
    h("span", " " + st + " " + counts[st], item);
  });
}

// --- zoom: a rank and its ring neighbours, with the links between them -----------------------
var zoomBox = null;
function zoomTo(r) {
  if (!zoomBox || posOf[r] === undefined) { return; }
  while (zoomBox.firstChild) { zoomBox.removeChild(zoomBox.firstChild); }
  var n = ORDER.length, i = posOf[r], k = Math.min(4, Math.floor((n - 1) / 2));
  var nav = h("div", null, zoomBox, "nav");
  var prev = h("button", "\u25c0 previous", nav); prev.addEventListener("click", function () { zoomTo(ORDER[(i - 1 + n) % n]); });
  var next = h("button", "next \u25b6", nav); next.addEventListener("click", function () { zoomTo(ORDER[(i + 1) % n]); });
  var inp = h("input", null, nav); inp.type = "number"; inp.min = 0; inp.max = N - 1; inp.value = r;
  var go = h("button", "zoom to rank", nav);
  go.addEventListener("click", function () { var v = parseInt(inp.value, 10); if (posOf[v] !== undefined) { zoomTo(v); } });
  var ranks = [], lo = n <= 9 ? -Math.floor((n - 1) / 2) : -k, hi = n <= 9 ? lo + n - 1 : k;
  for (var d = lo; d <= hi; d++) { ranks.push(ORDER[((i + d) % n + n) % n]); }
  var W = 940, step = W / ranks.length, s = svg(W, 150, zoomBox);
  s.setAttribute("id", "zoom-svg");
  ranks.forEach(function (q, j) {
    var x = step * (j + 0.5);
    if (j + 1 < ranks.length) {
      var nx = step * (j + 1.5), bad = linkKey[q + ">" + ranks[j + 1]], back = linkKey[ranks[j + 1] + ">" + q];
      el("line", {x1: x + 22, y1: 50, x2: nx - 26, y2: 50, stroke: bad ? BLAME : "#888", "stroke-width": bad ? 5 : 2}, s);
      el("polygon", {points: (nx - 26) + ",44 " + (nx - 18) + ",50 " + (nx - 26) + ",56", fill: bad ? BLAME : "#888"}, s);
      if (bad || back) { text(s, (x + nx) / 2, 36, "blamed link", {"text-anchor": "middle", "class": "blame-label"}); }
    }
    var c = el("circle", {cx: x, cy: 50, r: 20, fill: color(stateOf(q)), stroke: blamed[q] ? BLAME : "#333",
      "stroke-width": blamed[q] ? 5 : (q === r ? 3 : 1), "class": "zoom-rank", "data-rank": q}, s);
    tip(c, rankInfo(q));
    c.addEventListener("click", function () { zoomTo(q); });
    text(s, x, 55, q, {"text-anchor": "middle", "class": "node-label"});
    text(s, x, 88, stateOf(q), {"text-anchor": "middle", "class": "small"});
    var host = str("host", q); if (host) { text(s, x, 104, short(host, 18), {"text-anchor": "middle", "class": "small"}); }
    var isl = str("island", q); if (isl) { text(s, x, 120, "island " + short(isl, 12), {"text-anchor": "middle", "class": "small"}); }
    if (blamed[q]) { text(s, x, 140, "blamed", {"text-anchor": "middle", "class": "blame-label"}); }
  });
  h("p", rankInfo(r), zoomBox, "detail").setAttribute("id", "zoom-detail");
}

// --- timeline: the last ops of the blamed part, up to the incident ----------------------------
function drawTimeline(box) {
  var rows = D.timeline;
  if (!rows.length) { h("p", "no op records with times to draw", box); return; }
  var tmin = 0, tmax = 0;
  rows.forEach(function (row) { row.ops.forEach(function (o) {
    if (o[2] !== null) { tmin = Math.min(tmin, o[2]); }
    if (o[3] !== null) { tmax = Math.max(tmax, o[3]); }
  }); });
  if (tmax - tmin < 1e-3) { tmin = tmax - 1; }
  var W = 940, L = 190, RM = 190, RH = 22, top = 24, ht = top + rows.length * RH + 30;
  var s = svg(W, ht, box);
  s.setAttribute("id", "timeline-svg");
  function x(t) { return L + (t - tmin) / (tmax - tmin) * (W - L - RM); }
  for (var k = 0; k <= 5; k++) {
    var t = tmin + (tmax - tmin) * k / 5, xx = x(t);
    el("line", {x1: xx, y1: top - 4, x2: xx, y2: ht - 26, stroke: "#eee"}, s);
    text(s, xx, ht - 10, fmtMs(t), {"text-anchor": "middle", "class": "small"});
  }
  el("line", {x1: x(0), y1: top - 10, x2: x(0), y2: ht - 26, stroke: "#333", "stroke-dasharray": "4 3"}, s);
  text(s, x(0), top - 12, "incident", {"text-anchor": "middle", "class": "small"});
  rows.forEach(function (row, j) {
    var y = top + j * RH, r = row.rank;
    el("rect", {x: 4, y: y + 4, width: 10, height: 12, fill: color(stateOf(r))}, s);
    var host = str("host", r);
    var lab = text(s, 20, y + 15, "rank " + r + (host ? " (" + short(host, 14) + ")" : ""),
      {"class": blamed[r] ? "blame-label" : "", "data-rank": r});
    tip(lab, rankInfo(r));
    row.ops.forEach(function (o) {
      if (o[2] === null) { return; }
      var open = o[3] === null, x1 = x(o[2]), x2 = open ? x(tmax) : x(o[3]);
      var fill = o[4] === "failed" ? BLAME : (open ? (blamed[r] ? BLAME : "#4e79a7") : "#59a14f");
      var b = el("rect", {x: x1, y: y + 3, width: Math.max(1.5, x2 - x1), height: RH - 6, fill: fill,
        opacity: open ? 0.55 : 0.9, "class": open ? "op open" : "op"}, s);
      var desc = o[1] + " seq " + o[0] + ": started " + fmtMs(o[2]) + (open ? ", never completed (still in it at the incident)"
        : ", completed " + fmtMs(o[3])) + ", " + fmtBytes(o[5]) + ", " + o[4];
      if (o[6]) { desc += "; phases: vendor " + fmtMs(o[6][0]) + ", d2h " + fmtMs(o[6][1]) + ", wire " + fmtMs(o[6][2]) +
        ", h2d " + fmtMs(o[6][3]) + ", " + o[6][4] + " chunks"; }
      tip(b, desc);
      if (D.seq !== null && o[0] === D.seq) { el("rect", {x: x1 - 1, y: y + 1, width: 2.5, height: RH - 2, fill: "#000"}, s); }
    });
    var note = null;
    if (!row.dump) { note = "no dump"; }
    else if (D.seq !== null && (row.position === null || row.position < D.seq)) {
      note = "never called seq " + D.seq;
    }
    if (note) {
      var nt = text(s, W - RM + 8, y + 15, note, {"class": "blame-label never"});
      tip(nt, "rank " + r + ": " + (row.position !== null ? "last op on comm " + D.comm + " is seq " + row.position : "no op on comm " + D.comm));
    }
  });
}

// --- arrival histogram: every rank, at the incident's sequence id -----------------------------
function histogram(box, values, extra, label, fmt) {
  var W = 940, ht = 170, L = 40, B = 30, s = svg(W, ht, box);
  var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
  var nb = values.length > 1 && hi > lo ? 24 : 1, bins = new Array(nb).fill(0);
  values.forEach(function (v) { bins[Math.min(nb - 1, Math.floor((v - lo) / ((hi - lo) || 1) * nb))]++; });
  var cols = bins.length + (extra ? 1 : 0), bw = (W - L - 10) / cols;
  var top = Math.max.apply(null, bins.concat(extra ? [extra.count] : []));
  function bar(i, cnt, fill, tipText, lab) {
    var hh = top ? Math.max(cnt ? 2 : 0, (ht - B - 20) * cnt / top) : 0;  // one rank of thousands stays visible
    var b = el("rect", {x: L + i * bw + 1, y: ht - B - hh, width: Math.max(1, bw - 2), height: hh, fill: fill}, s);
    tip(b, tipText);
    if (lab !== null) { text(s, L + i * bw + bw / 2, ht - B + 14, lab, {"text-anchor": "middle", "class": "small"}); }
    if (cnt) { text(s, L + i * bw + bw / 2, ht - B - hh - 3, cnt, {"text-anchor": "middle", "class": "small"}); }
  }
  bins.forEach(function (cnt, i) {
    var a = lo + (hi - lo) * i / nb, b = lo + (hi - lo) * (i + 1) / nb;
    bar(i, cnt, "#4e79a7", cnt + " rank(s): " + fmt(a) + " to " + fmt(b), i % 6 === 0 || nb === 1 ? fmt(a) : null);
  });
  if (extra) { bar(bins.length, extra.count, BLAME, extra.count + " " + extra.label, extra.label); }
  text(s, L, 12, label, {"class": "small"});
}
function drawArrivals(box) {
  var got = D.arrivals.filter(function (v) { return v !== null; });
  var never = D.arrivals.length - got.length;
  if (D.seq === null || !D.arrivals.length || (!got.length && !never)) { h("p", "no arrival data", box); return; }
  var first = got.length ? Math.min.apply(null, got) : 0;
  histogram(box, got.length ? got.map(function (v) { return v - first; }) : [0], never ? {count: never, label: "never"} : null,
    "arrival at " + ((D.report.verdicts[0] && D.report.verdicts[0].op) || "the op") + " seq " + D.seq + " on comm " + D.comm + ", after the first rank (" +
    got.length + " arrived, " + never + " never did, of " + D.arrivals.length + " dumps)", fmtMs);
}

// --- per-link bandwidth: bytes over busy time ---------------------------------------------------
function drawLinks(box) {
  var rows = D.links.filter(function (l) { return l[3] && l[4]; }).map(function (l) {
    return {src: l[0], dst: l[1], tr: l[2] || "?", bytes: l[3], gbps: l[3] / l[4], bad: linkKey[l[0] + ">" + l[1]]};
  });
  if (!rows.length) { h("p", "no link counters with traffic in the dumps", box); return; }
  if (rows.length <= 48) {
    var W = 940, L = 170, RH = 18, s = svg(W, rows.length * RH + 10, box);
    var top = Math.max.apply(null, rows.map(function (r) { return r.gbps; }));
    rows.forEach(function (r, j) {
      var y = j * RH + 4, w = (W - L - 170) * r.gbps / top;
      text(s, 4, y + 12, r.src + " \u2192 " + r.dst + " (" + r.tr + ")", {"class": r.bad ? "blame-label" : ""});
      var b = el("rect", {x: L, y: y + 2, width: Math.max(1, w), height: RH - 4, fill: r.bad ? BLAME : "#4e79a7"}, s);
      tip(b, "link " + r.src + " \u2192 " + r.dst + ": " + r.gbps.toFixed(3) + " GB/s over busy time, " + fmtBytes(r.bytes) + " sent");
      text(s, L + Math.max(1, w) + 6, y + 12, r.gbps.toFixed(2) + " GB/s, " + fmtBytes(r.bytes), {"class": "small"});
    });
    return;
  }
  histogram(box, rows.map(function (r) { return r.gbps; }), null, rows.length +
    " links, GB/s over busy time (network bandwidth, not busbw)", function (v) { return v.toFixed(2); });
  var worst = rows.slice().sort(function (a, b) { return a.gbps - b.gbps; }).slice(0, 8);
  rows.forEach(function (r) { if (r.bad && worst.indexOf(r) < 0) { worst.push(r); } });
  var t = h("table", null, box), hd = h("tr", null, t);
  ["link", "transport", "GB/s", "bytes sent", ""].forEach(function (c) { h("th", c, hd); });
  worst.forEach(function (r) {
    var tr = h("tr", null, t, r.bad ? "blamed" : "");
    [r.src + " \u2192 " + r.dst, r.tr, r.gbps.toFixed(3), fmtBytes(r.bytes), r.bad ? "blamed" : "slowest"].forEach(function (c) { h("td", c, tr); });
  });
}

function run(id, fn) {
  var box = document.getElementById(id);
  if (!box) { return true; }
  try { fn(box); return true; } catch (e) {
    h("p", "could not draw this part: " + e, box, "error");
    console.error("hetobs report: " + id + ": " + e);
    return false;
  }
}
var ok = run("ring", drawRing) & run("legend", drawLegend) & run("timeline", drawTimeline) &
  run("arrivals", drawArrivals) & run("bandwidth", drawLinks);
zoomBox = document.getElementById("zoom");
var centre = D.blamed.length ? D.blamed[0] : (D.blamed_links.length ? D.blamed_links[0][0] : ORDER[0]);
ok &= run("zoom", function () { if (centre !== undefined) { zoomTo(centre); } });
document.body.setAttribute("data-rendered", ok ? "ok" : "error");
document.body.setAttribute("data-render-ms", (performance.now() - started).toFixed(1));
})();
"""
