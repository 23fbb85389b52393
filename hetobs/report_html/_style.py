"""The page's one inline style sheet (allowed by hash in the page's Content-Security-Policy)."""

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #222; max-width: 1000px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 17px; border-bottom: 1px solid #ddd; margin-top: 24px; }
h3 { font-size: 14px; margin: 8px 0 4px; }
.status { font-weight: bold; padding: 1px 6px; border-radius: 3px; color: #fff; }
.status.fault { background: #d62728; } .status.healthy { background: #2ca02c; } .status.no_data { background: #b8860b; }
.verdict { border-left: 5px solid #d62728; padding: 4px 10px; margin: 8px 0; background: #fff6f6; }
.verdict.advisory { border-color: #f28e2b; background: #fffaf2; }
.verdict .kind { font-family: monospace; } .summary { font-weight: 600; margin: 2px 0; }
.meta, .small, .hint { color: #555; font-size: 12px; } .evidence { margin: 2px 0; padding-left: 20px; }
pre { background: #f4f4f4; padding: 6px; overflow-x: auto; font-size: 12px; }
.row { display: flex; gap: 16px; align-items: flex-start; }
.legend-item { display: inline-block; margin: 0 12px 4px 0; font-size: 12px; }
svg text { font: 12px system-ui, sans-serif; fill: #222; } svg text.small { font-size: 10px; fill: #555; }
svg text.big { font-size: 18px; font-weight: bold; } svg text.node-label { font-weight: bold; fill: #fff; }
svg text.blame-label { fill: #d62728; font-weight: bold; } svg text.island-name { font-weight: bold; fill: #444; }
svg .rank, svg .hit, svg .zoom-rank, svg .blamed-mark { cursor: pointer; }
table { border-collapse: collapse; font-size: 12px; } td, th { border: 1px solid #ddd; padding: 2px 6px; }
tr.blamed td { background: #fde0e0; font-weight: 600; } .error { color: #d62728; }
.nav button, .nav input { margin-right: 6px; font-size: 12px; } .nav input { width: 80px; }
.detail { font-size: 12px; }
"""
