// The live page of an elasticd driver: polls v1/status (relative, so it works behind a path
// prefix) and redraws. Plain DOM, no libraries. The same page is the job's post-mortem
// (report.html in --output-dir): there the final status is embedded in a
// <script type="application/json" id="final-status">, drawn once, and nothing is polled. Status strings (host IDs, messages) come from
// the cluster and are untrusted: they only ever go into textContent and attribute values.
'use strict';

(function () {
  const POLL_MS = 1000;           // while the job runs
  const FINISHED_POLL_MS = 5000;  // once it has finished: nothing changes much any more
  const MAX_BACKOFF_MS = 10000;   // between retries while the driver does not answer
  const FETCH_TIMEOUT_MS = 5000;  // a driver that accepts but never answers counts as down
  const SPARK_POINTS = 120;       // step-rate samples kept for the sparkline (one per poll)
  const CAUSES = ['failure', 'scale-up', 'removal', 'notice'];
  // Hosts are drawn a page at a time, and the live page asks the driver for just that page
  // (v1/status?state=&offset=&limit=): a fleet of thousands is counted by state, not sent
  // row by row every second.
  const HOSTS_PAGE = 100;
  const HOST_STATES = ['active', 'idle', 'leaving', 'blacklisted', 'quarantined'];

  // The SVG namespace, taken from an <svg> the HTML parser made, so that no URL is spelled here.
  const SVG_NS = document.getElementById('world-chart').namespaceURI;

  let last = null;      // the last status drawn: kept while the driver is unreachable
  let lastAt = 0;       // when it was fetched (ms, client clock)
  let failures = 0;     // consecutive failed polls
  const rates = [];     // {now, rate}, oldest first
  let hostsState = '';  // the host state shown ('' every state)
  let hostsOffset = 0;  // the first host shown, among those of hostsState
  let pollTimer = 0;    // the next poll
  let polling = false;  // a poll is under way
  let pollAgain = false; // the page changed while it was: poll again at once

  // ---- DOM helpers ----

  function byId(id) {
    return document.getElementById(id);
  }

  function setText(id, text) {
    byId(id).textContent = text;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k of Object.keys(attrs || {})) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function badge(kind, value) {
    const b = el('span', 'badge ' + kind, value || '—');
    b.dataset.value = value || '';
    return b;
  }

  // ---- formatting ----

  function isNum(v) {
    return typeof v === 'number' && isFinite(v);
  }

  function fmtInt(v) {
    return isNum(v) ? Math.round(v).toLocaleString('en-US') : '—';
  }

  function fmtRate(v) {
    if (!isNum(v)) return '—';
    if (v >= 100) return v.toFixed(0);
    if (v >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  function pad2(n) {
    return String(n).padStart(2, '0');
  }

  // 723.4 -> "12m 03s", 3723 -> "1h 02m 03s", 183600 -> "2d 03h 00m".
  function fmtDuration(sec) {
    if (!isNum(sec) || sec < 0) return '—';
    let s = Math.floor(sec);
    const d = Math.floor(s / 86400); s -= d * 86400;
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    if (d > 0) return d + 'd ' + pad2(h) + 'h ' + pad2(m) + 'm';
    if (h > 0) return h + 'h ' + pad2(m) + 'm ' + pad2(s) + 's';
    if (m > 0) return m + 'm ' + pad2(s) + 's';
    return s + 's';
  }

  // A time to go, to the two units that matter: "18s", "12m 03s", "5h 33m", "2d 03h".
  function fmtEta(sec) {
    const full = fmtDuration(sec);
    return full.split(' ').slice(0, 2).join(' ');
  }

  // Seconds since the start, for the chart's axis: "0:00", "12:30", "1:02:00".
  function fmtOffset(sec) {
    let s = Math.round(sec);
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    return h > 0 ? h + ':' + pad2(m) + ':' + pad2(s) : m + ':' + pad2(s);
  }

  function fmtClock(iso) {
    const d = new Date(iso);
    if (isNaN(d)) return '—';
    return pad2(d.getHours()) + ':' + pad2(d.getMinutes()) + ':' + pad2(d.getSeconds());
  }

  function fmtDateTime(iso) {
    const d = new Date(iso);
    if (isNaN(d)) return '—';
    return d.getFullYear() + '-' + pad2(d.getMonth() + 1) + '-' + pad2(d.getDate()) + ' ' + fmtClock(iso);
  }

  // Money: the currency and 2 decimals, 4 below 1.00 (a few minutes of a spot GPU).
  function fmtMoney(v, currency) {
    if (!isNum(v)) return '—';
    const digits = v !== 0 && Math.abs(v) < 1 ? 4 : 2;
    try {
      return new Intl.NumberFormat('en-US', {
        style: 'currency', currency: currency || 'USD',
        minimumFractionDigits: digits, maximumFractionDigits: digits,
      }).format(v);
    } catch (e) { // not an ISO 4217 code
      return (currency ? currency + ' ' : '') + v.toFixed(digits);
    }
  }

  // A loss: 4 significant digits, which is what a curve's trend needs.
  function fmtLoss(v) {
    if (!isNum(v)) return '—';
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-4 || a >= 1e6)) return v.toExponential(3);
    return String(Number(v.toPrecision(4)));
  }

  // Whether any of the cost's instance time has a price: without one, every figure would
  // read as a free job, so the page says "unpriced" instead (as the CLI's cost line does).
  function priced(c) {
    return (c.instance_seconds || []).some((l) => isNum(l.cost));
  }

  // ---- sections ----

  function renderHeader(s) {
    setText('job-id', s.job_id || '—');
    const phase = byId('phase');
    phase.textContent = s.phase || 'unknown';
    phase.dataset.phase = s.phase || '';
    setText('mode', s.mode ? s.mode + ' mode' : '');
    setText('generation', fmtInt(s.generation));
    setText('elapsed', fmtDuration(s.elapsed_seconds));
    setText('started-at', fmtDateTime(s.started_at));
    document.title = 'elasticd · ' + (s.job_id || '') + ' · ' + (s.finished ? 'finished' : (s.phase || ''));

    const f = s.finished;
    const banner = byId('finished');
    banner.hidden = !f;
    if (f) {
      banner.dataset.ok = f.code === 0 ? '1' : '0';
      setText('finished-title', (f.code === 0 ? 'Finished' : 'Failed') + ' · exit code ' + f.code);
      setText('finished-reason', f.reason || '');
    }
  }

  function renderStats(s) {
    const p = s.progress || {};
    const reported = !!p.updated_at;
    setText('world-size', fmtInt(s.world_size));
    setText('world-bounds', 'np ' + fmtInt(s.np) + ' · min ' + fmtInt(s.min_np) + ' · max ' + fmtInt(s.max_np));
    setText('step', reported ? fmtInt(p.step) : '—');
    setText('step-seconds', reported && isNum(p.step_seconds) ? (p.step_seconds * 1000).toFixed(1) + ' ms per step' : 'no report yet');
    setText('committed-step', reported ? fmtInt(p.committed_step) : '—');
    setText('uncommitted', reported && isNum(p.step) && isNum(p.committed_step)
      ? fmtInt(p.step - p.committed_step) + ' steps since the commit' : '');
    setText('step-rate', reported ? fmtRate(p.steps_per_second) : '—');
    setText('resets', fmtInt(s.resets));

    // Time to go, and step X of N, where the program reported its total.
    const total = isNum(p.total_steps) && p.total_steps > 0 ? p.total_steps : 0;
    let eta = '—';
    if (s.finished) {
      eta = total && p.step >= total ? 'done' : '—';
    } else if (isNum(p.eta_seconds)) {
      eta = fmtEta(p.eta_seconds);
    }
    setText('eta', eta);
    let of = '';
    if (reported && total) {
      of = 'step ' + fmtInt(p.step) + ' of ' + fmtInt(total) + ' (' + (100 * Math.min(1, p.step / total)).toFixed(1) + '%)';
    } else if (reported) {
      of = 'step ' + fmtInt(p.step) + ' · total steps not reported';
    }
    setText('step-of', of);

    setText('loss', fmtLoss(p.loss));
    const losses = (s.progress_history || []).map((pt) => pt.loss).filter(isNum);
    setText('loss-sub', isNum(p.loss)
      ? (losses.length > 1 ? 'lowest ' + fmtLoss(Math.min(...losses)) : 'latest report')
      : 'not reported by the program');

    const by = s.resets_by_cause || {};
    const causes = CAUSES.concat(Object.keys(by).filter((k) => !CAUSES.includes(k)));
    byId('resets-by-cause').replaceChildren(...causes.map((c) => {
      const n = by[c] || 0;
      const li = el('li', n > 0 ? 'cause some' : 'cause');
      li.dataset.cause = c;
      li.append(el('span', 'name', c), el('span', 'n', fmtInt(n)));
      return li;
    }));

    if (reported && isNum(p.steps_per_second) && (!rates.length || rates[rates.length - 1].now !== s.now)) {
      rates.push({ now: s.now, rate: p.steps_per_second });
      if (rates.length > SPARK_POINTS) rates.splice(0, rates.length - SPARK_POINTS);
    }
    renderSpark();
  }

  function renderSpark() {
    const svg = byId('rate-spark');
    const W = 120, H = 28;
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.dataset.points = String(rates.length);
    if (rates.length < 2) {
      svg.replaceChildren();
      return;
    }
    // The trend matters more than the zero: scale to the samples' range, with some margin so
    // that noise of a few percent does not fill the height.
    const vals = rates.map((r) => r.rate);
    const hi = Math.max(...vals), lo = Math.min(...vals);
    const pad = Math.max((hi - lo) * 0.2, Math.abs(hi) * 0.05, 1e-9);
    const top = hi + pad, bottom = Math.max(0, lo - pad);
    // Until the window is full, the points spread over the whole width.
    const dx = W / (rates.length - 1);
    const pts = rates.map((r, i) => (i * dx).toFixed(1) + ',' +
      (H - 1 - ((r.rate - bottom) / (top - bottom)) * (H - 2)).toFixed(1));
    svg.replaceChildren(
      svgEl('polygon', { class: 'spark-area', points: '0,' + H + ' ' + pts.join(' ') + ' ' + W + ',' + H }),
      svgEl('polyline', { class: 'spark-line', points: pts.join(' ') }),
    );
  }

  // A tick step of 1, 2 or 5 times a power of ten, for about `count` ticks up to max.
  function niceStep(max, count) {
    const raw = max / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * mag >= raw) return m * mag;
    return 10 * mag;
  }

  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
    21600, 43200, 86400, 172800, 604800];

  // The time every chart spans: from the job's start (or its first point) to the status's now,
  // so that the charts line up one above the other.
  function timeRange(s) {
    let t0 = Date.parse(s.started_at);
    let t1 = Date.parse(s.now);
    for (const first of [(s.world_history || [])[0], (s.progress_history || [])[0]]) {
      const t = first ? Date.parse(first.at || first.t) : NaN;
      if (!isNaN(t) && (isNaN(t0) || t < t0)) t0 = t;
    }
    if (isNaN(t1) || isNaN(t0)) t1 = t0 = Date.now();
    if (t1 - t0 < 1000) t1 = t0 + 1000;
    return [t0, t1];
  }

  // Time ticks (offsets from the start), at most about `count` of them.
  function timeTicks(t0, t1, count) {
    const span = (t1 - t0) / 1000;
    const tstep = TIME_STEPS.find((st) => span / st <= count) || TIME_STEPS[TIME_STEPS.length - 1];
    const out = [];
    for (let o = 0; o <= span + 1e-9; o += tstep) out.push(o);
    return out;
  }

  function renderChart(s) {
    const svg = byId('world-chart');
    const box = svg.getBoundingClientRect();
    const W = Math.max(320, Math.round(box.width) || 640);
    const H = Math.max(180, Math.round(box.height) || 220);
    const m = { l: 40, r: 56, t: 14, b: 28 };
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    const kids = [];

    const hist = (s.world_history || []).filter((p) => !isNaN(Date.parse(p.at)));
    const [t0, t1] = timeRange(s);
    const ymax = Math.max(1, s.max_np || 0, ...hist.map((p) => p.world_size || 0));
    const x = (t) => m.l + ((t - t0) / (t1 - t0)) * (W - m.l - m.r);
    const y = (v) => m.t + (1 - v / ymax) * (H - m.t - m.b);

    // Axes and grid.
    const ystep = Math.max(1, niceStep(ymax, 4));
    for (let v = 0; v <= ymax + 1e-9; v += ystep) {
      kids.push(svgEl('line', { class: 'grid', x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }));
      kids.push(svgEl('text', { class: 'tick', x: m.l - 6, y: y(v) + 4, 'text-anchor': 'end' }, String(v)));
    }
    for (const o of timeTicks(t0, t1, 6)) {
      const px = x(t0 + o * 1000);
      kids.push(svgEl('line', { class: 'grid v', x1: px, x2: px, y1: m.t, y2: H - m.b }));
      kids.push(svgEl('text', { class: 'tick', x: px, y: H - m.b + 16, 'text-anchor': 'middle' }, fmtOffset(o)));
    }
    kids.push(svgEl('line', { class: 'axis', x1: m.l, x2: W - m.r, y1: y(0), y2: y(0) }));
    for (const [name, v] of [['min', s.min_np], ['max', s.max_np]]) {
      if (!isNum(v) || v <= 0) continue;
      kids.push(svgEl('line', { class: 'bound', x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }));
      kids.push(svgEl('text', { class: 'bound-label', x: W - m.r + 6, y: y(v) + 4 }, name + ' ' + v));
    }

    // The world size holds from one point to the next: a step-shaped line up to now.
    const line = svgEl('path', { id: 'world-line', class: 'line' });
    line.dataset.points = String(hist.length);
    if (hist.length) {
      const px = hist.map((p) => x(Date.parse(p.at)).toFixed(1));
      const py = hist.map((p) => y(p.world_size || 0).toFixed(1));
      let d = 'M' + px[0] + ' ' + py[0];
      for (let i = 1; i < hist.length; i++) d += ' H' + px[i] + ' V' + py[i];
      d += ' H' + x(t1).toFixed(1);
      line.setAttribute('d', d);
      kids.push(svgEl('path', { class: 'area', d: d + ' V' + y(0).toFixed(1) + ' H' + px[0] + ' Z' }));
      kids.push(line);
      hist.forEach((p, i) => {
        const dot = svgEl('circle', { class: 'pt', cx: px[i], cy: py[i], r: 3 });
        dot.append(svgEl('title', {}, 'generation ' + p.generation + ': ' + p.world_size +
          ' workers at ' + fmtClock(p.at)));
        kids.push(dot);
      });
    } else {
      kids.push(line);
      kids.push(svgEl('text', { class: 'empty', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no generation yet'));
    }
    svg.replaceChildren(...kids);
  }

  // renderSeries draws one value of the progress history over time as a line: pts are
  // {t: ms, v}, fmt formats the y ticks, empty says why there is no line.
  // The decimals a tick step needs: 0.5 -> 1, 20 -> 0, 0.02 -> 2.
  function tickDigits(step) {
    return Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9)));
  }

  function renderSeries(id, s, pts, fmt, empty) {
    const svg = byId(id);
    const box = svg.getBoundingClientRect();
    const W = Math.max(240, Math.round(box.width) || 400);
    const H = Math.max(120, Math.round(box.height) || 160);
    const m = { l: 58, r: 18, t: 10, b: 24 };
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    svg.dataset.points = String(pts.length);
    const [t0, t1] = timeRange(s);
    const x = (t) => m.l + ((Math.min(Math.max(t, t0), t1) - t0) / (t1 - t0)) * (W - m.l - m.r);
    const kids = [];
    const line = svgEl('path', { class: 'line' });
    line.dataset.points = String(pts.length);

    let lo = 0, hi = 1;
    if (pts.length) {
      const vals = pts.map((p) => p.v);
      lo = Math.min(0, ...vals);
      hi = Math.max(...vals);
      if (hi <= lo) hi = lo + (Math.abs(lo) || 1);
    }
    const ystep = niceStep(hi - lo, 3);
    hi = Math.ceil(hi / ystep - 1e-9) * ystep;
    lo = Math.floor(lo / ystep + 1e-9) * ystep;
    const y = (v) => m.t + (1 - (v - lo) / (hi - lo)) * (H - m.t - m.b);
    for (let v = lo; v <= hi + ystep * 1e-6; v += ystep) {
      kids.push(svgEl('line', { class: 'grid', x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }));
      kids.push(svgEl('text', { class: 'tick', x: m.l - 6, y: y(v) + 4, 'text-anchor': 'end' }, fmt(v, tickDigits(ystep))));
    }
    for (const o of timeTicks(t0, t1, 4)) {
      const px = x(t0 + o * 1000);
      kids.push(svgEl('line', { class: 'grid v', x1: px, x2: px, y1: m.t, y2: H - m.b }));
      // A label at the right edge ends there rather than past the chart.
      const anchor = o > 0 && px > W - m.r - 16 ? 'end' : 'middle';
      kids.push(svgEl('text', { class: 'tick', x: anchor === 'end' ? W - 2 : px, y: H - m.b + 16, 'text-anchor': anchor }, fmtOffset(o)));
    }
    kids.push(svgEl('line', { class: 'axis', x1: m.l, x2: W - m.r, y1: y(Math.max(lo, 0)), y2: y(Math.max(lo, 0)) }));
    if (pts.length) {
      const xy = pts.map((p) => [x(p.t).toFixed(1), y(p.v).toFixed(1)]);
      const d = 'M' + xy.map((c) => c[0] + ' ' + c[1]).join(' L');
      line.setAttribute('d', d);
      kids.push(svgEl('path', { class: 'area', d: d + ' V' + y(Math.max(lo, 0)).toFixed(1) + ' H' + xy[0][0] + ' Z' }));
      kids.push(line);
      const lastPt = xy[xy.length - 1];
      const dot = svgEl('circle', { class: 'pt', cx: lastPt[0], cy: lastPt[1], r: 3 });
      dot.append(svgEl('title', {}, fmt(pts[pts.length - 1].v) + ' at ' + fmtOffset((pts[pts.length - 1].t - t0) / 1000)));
      kids.push(dot);
    } else {
      kids.push(line);
      kids.push(svgEl('text', { class: 'empty', x: (m.l + W - m.r) / 2, y: H / 2, 'text-anchor': 'middle' }, empty));
    }
    svg.replaceChildren(...kids);
  }

  function renderCharts(s) {
    renderChart(s);
    const hist = (s.progress_history || []).filter((p) => !isNaN(Date.parse(p.t)));
    const series = (key) => hist.filter((p) => isNum(p[key])).map((p) => ({ t: Date.parse(p.t), v: p[key] }));
    const reported = !!(s.progress && s.progress.updated_at);
    // Ticks show the digits their step needs; the last point's title, the value's own format.
    const tick = (fmt) => (v, digits) => (digits === undefined ? fmt(v) : v.toFixed(digits));
    renderSeries('rate-chart', s, reported ? series('steps_per_second') : [], tick(fmtRate), 'no progress reported yet');
    renderSeries('loss-chart', s, series('loss'), tick(fmtLoss),
      reported ? 'no loss reported (State.SetLoss, elasticd.progress(loss=…))' : 'no progress reported yet');
    const c = s.cost || {};
    const cur = c.currency || 'USD';
    setText('cost-chart-unit', cur);
    const unpriced = !priced(c) && (c.unpriced || []).length > 0;
    const moneyTick = (v, digits) => {
      if (digits === undefined) return fmtMoney(v, cur);
      try {
        return new Intl.NumberFormat('en-US', { style: 'currency', currency: cur, minimumFractionDigits: digits, maximumFractionDigits: digits }).format(v);
      } catch (e) {
        return v.toFixed(digits);
      }
    };
    renderSeries('cost-chart', s, unpriced ? [] : series('cost'), moneyTick,
      unpriced ? 'unpriced: give --prices FILE' : 'no cost yet');
  }

  function td(text, cls) {
    return el('td', cls, text);
  }

  // emptyRow is a table's one row saying it has nothing yet, across its cols columns.
  function emptyRow(text, cols) {
    const tr = el('tr', 'empty');
    const cell = td(text);
    cell.colSpan = cols;
    tr.append(cell);
    return tr;
  }

  function renderHosts(s) {
    const cur = (s.cost && s.cost.currency) || 'USD';
    const ranks = {};
    for (const w of s.workers || []) {
      if (isNum(w.rank) && w.rank >= 0) (ranks[w.host] = ranks[w.host] || []).push(w.rank);
    }
    const view = hostsView(s);
    renderHostsBar(s, view);
    const hosts = view.rows;
    const rows = hosts.map((h) => {
      const tr = el('tr');
      tr.dataset.hostId = h.id;
      tr.dataset.state = h.state || '';
      const state = td('');
      state.append(badge('state', h.state));
      const life = td('');
      life.append(badge('lifecycle', h.lifecycle));
      if (h.fallback) {
        const fb = badge('fallback', 'fallback');
        fb.title = 'a host of the on-demand fallback group: the job moves off it once spot can carry -np again';
        life.append(' ', fb);
      }
      const id = td('', 'id');
      id.append(el('code', '', h.id));
      const r = (ranks[h.id] || []).sort((a, b) => a - b);
      const uptime = td(isNum(h.uptime_seconds) && h.since && !h.since.startsWith('0001-') ? fmtDuration(h.uptime_seconds) : '—', 'num uptime');
      uptime.title = h.since ? 'in the group since ' + fmtDateTime(h.since) : '';
      const beat = td(isNum(h.heartbeat_age_seconds) ? fmtDuration(h.heartbeat_age_seconds) + ' ago' : '—', 'num heartbeat');
      beat.title = h.last_heartbeat ? 'last heard from at ' + fmtDateTime(h.last_heartbeat)
        : 'no heartbeat: the driver hears from hosts that run an agent or in-process workers';
      const fails = td('', h.failures > 0 ? 'failures warn' : 'failures');
      fails.append(el('span', 'n', fmtInt(h.failures || 0)));
      const lf = h.last_failure;
      if (h.failures > 0 && lf) {
        const ago = (Date.parse(s.now) - Date.parse(lf.at)) / 1000;
        fails.append(el('span', 'last', lf.cause + (isNum(ago) ? ', ' + fmtDuration(ago) + ' ago' : '')));
        fails.title = 'last: ' + lf.worker + ' ' + lf.cause + ' at ' + fmtDateTime(lf.at);
      }
      tr.append(
        id, td(h.addr || '—', 'addr'), state, life, td(h.type || '—'), td(h.zone || '—'),
        td(fmtInt(h.slots), 'num'),
        td(fmtInt(h.blacklisted_slots), h.blacklisted_slots > 0 ? 'num warn' : 'num'),
        td(r.length ? r.join(' ') : '—', 'ranks'),
        uptime, beat, fails,
        td(fmtMoney(h.price_per_hour, cur), 'num price'),
      );
      return tr;
    });
    if (!rows.length) rows.push(emptyRow(hostsState ? 'no ' + hostsState + ' host' : 'no hosts discovered yet', 13));
    byId('hosts').replaceChildren(...rows);
  }

  // hostsView is the page of hosts to draw: the driver's page as it sent it, or, from a
  // status that lists every host (the post-mortem report, an older driver), the page cut
  // out here. matching counts the hosts of hostsState, total every host.
  function hostsView(s) {
    let hosts = s.hosts || [];
    const total = isNum(s.hosts_total) ? s.hosts_total : hosts.length;
    let matching = isNum(s.hosts_matching) ? s.hosts_matching : hosts.length;
    let from = hostsOffset;
    if (hosts.length > HOSTS_PAGE || (hostsState && hosts.some((h) => h.state !== hostsState))) {
      if (hostsState) hosts = hosts.filter((h) => h.state === hostsState);
      matching = hosts.length;
      from = Math.min(hostsOffset, Math.max(0, matching - 1));
      hosts = hosts.slice(from, from + HOSTS_PAGE);
    }
    return { rows: hosts, from: from, matching: matching, total: total };
  }

  function renderHostsBar(s, view) {
    setText('hosts-count', view.total ? '(' + fmtInt(view.total) + ')' : '');
    let counts = s.host_states;
    if (!counts) { // an older driver's status: count the hosts it lists
      counts = {};
      for (const h of s.hosts || []) counts[h.state] = (counts[h.state] || 0) + 1;
    }
    const chips = [];
    if (view.total > 0) {
      const chip = (state, text) => {
        const b = el('button', '', text);
        b.type = 'button';
        b.dataset.state = state;
        b.setAttribute('aria-pressed', String(state === hostsState));
        b.addEventListener('click', () => showHosts(state, 0));
        chips.push(b);
      };
      chip('', 'all ' + fmtInt(view.total));
      for (const st of HOST_STATES) {
        if (counts[st] > 0 || st === hostsState) chip(st, st + ' ' + fmtInt(counts[st] || 0));
      }
    }
    byId('host-states').replaceChildren(...chips);
    if (!view.rows.length && view.matching > 0 && hostsOffset > 0) {
      hostsOffset = Math.floor((view.matching - 1) / HOSTS_PAGE) * HOSTS_PAGE; // the fleet shrank: its last page
    }
    const pager = byId('hosts-pager');
    pager.hidden = view.matching <= HOSTS_PAGE && view.from === 0;
    setText('hosts-range', view.rows.length
      ? fmtInt(view.from + 1) + '–' + fmtInt(view.from + view.rows.length) + ' of ' + fmtInt(view.matching)
      : '0 of ' + fmtInt(view.matching));
    byId('hosts-prev').disabled = view.from === 0;
    byId('hosts-next').disabled = view.from + view.rows.length >= view.matching;
  }

  // showHosts shows the hosts of state from the offset-th: at once from the status at hand
  // where it lists them all (the report), else by polling the driver for that page now.
  function showHosts(state, offset) {
    hostsState = state;
    hostsOffset = Math.max(0, offset);
    if (embedded || !last) {
      if (last) renderHosts(last);
      return;
    }
    if (polling) {
      pollAgain = true;
      return;
    }
    clearTimeout(pollTimer);
    tick();
  }

  function pageStep(dir) {
    const view = last ? hostsView(last) : { from: 0 };
    showHosts(hostsState, view.from + dir * HOSTS_PAGE);
  }

  function renderEvents(s) {
    const events = (s.events || []).slice().reverse(); // newest first
    const items = events.map((ev) => {
      const li = el('li');
      li.dataset.kind = ev.kind || '';
      const t = el('time', '', fmtClock(ev.at));
      t.dateTime = ev.at || '';
      t.title = ev.at || '';
      li.append(t, badge('kind', ev.kind), el('span', 'msg', ev.message || ''));
      return li;
    });
    if (!items.length) items.push(el('li', 'empty', 'no events yet'));
    byId('events').replaceChildren(...items);

    const notices = s.notices || [];
    const line = byId('notices');
    line.hidden = !notices.length;
    line.textContent = notices.length ? 'Notices received: ' + notices.map((n) =>
      (n.provider || '?') + ' ' + (n.kind || '?') + ' × ' + fmtInt(n.count)).join(', ') : '';
  }

  function renderCost(s) {
    const c = s.cost || {};
    const p = s.progress || {};
    const cur = c.currency || 'USD';
    const unpriced = c.unpriced || [];
    // With no price at all, every total would be a zero that reads as free: say unpriced.
    const none = !priced(c) && unpriced.length > 0;
    const money = (v) => (none ? '—' : fmtMoney(v, cur));
    setText('cost-total', none ? 'unpriced' : fmtMoney(c.total, cur));
    byId('cost-total').dataset.unpriced = none ? '1' : '';
    setText('cost-spot', money(c.spot));
    setText('cost-on-demand', money(c.on_demand));
    setText('cost-od-equivalent', money(c.on_demand_equivalent));
    let savings = money(c.savings);
    if (!none && isNum(c.savings) && isNum(c.savings_percent)) savings += ' (' + c.savings_percent.toFixed(1) + '%)';
    setText('savings', savings);
    byId('savings').dataset.sign = !none && isNum(c.savings) ? String(Math.sign(c.savings)) : '';
    setText('rolled-back-cost', money(c.rolled_back));
    const parts = [];
    if (isNum(p.rolled_back_steps)) parts.push(fmtInt(p.rolled_back_steps) + ' steps');
    if (isNum(p.rolled_back_gpu_seconds)) parts.push(p.rolled_back_gpu_seconds.toFixed(1) + ' GPU·s');
    setText('rolled-back-steps', parts.length ? '(' + parts.join(', ') + ')' : '');

    const rows = (c.instance_seconds || []).map((r) => {
      const tr = el('tr');
      const life = td('');
      life.append(badge('lifecycle', r.lifecycle));
      const time = td(isNum(r.seconds) ? (r.seconds / 3600).toFixed(2) + ' h' : '—', 'num');
      time.title = isNum(r.seconds) ? fmtDuration(r.seconds) : '';
      tr.append(life, td(r.type || '—'), time, td(fmtMoney(r.cost, cur), 'num'));
      return tr;
    });
    if (!rows.length) rows.push(emptyRow('no instance time yet', 4));
    byId('instance-seconds').replaceChildren(...rows);

    renderCapacity(s, cur);

    const warn = byId('unpriced');
    warn.hidden = !unpriced.length;
    const how = 'give --prices FILE, each instance type\'s spot and on-demand price per hour (examples/prices.yaml); on AWS the spot prices come by themselves.';
    if (none) {
      warn.textContent = 'Unpriced: no price for ' + unpriced.join(', ') + '. To see the cost, ' + how;
    } else {
      warn.textContent = unpriced.length
        ? 'No price for ' + unpriced.join(', ') + ' — their time is not in the totals. To price it, ' + how
        : '';
    }
  }

  // What --manage-capacity did to the group, and to its on-demand fallback: the sizes set,
  // and what the fallback cost against the time it kept the job going.
  function renderCapacity(s, cur) {
    const c = s.capacity;
    const line = byId('capacity');
    line.hidden = !c;
    if (!c) return;
    const parts = [];
    let g = 'Group ' + c.group + ': ' + (c.final || (c.changes || []).join(', ') || 'desired ' + fmtInt(c.desired));
    if (c.refused) g = 'Group ' + c.group + ': not managed (' + c.refused + ')';
    parts.push(g);
    if ((c.handed_back || []).length) parts.push('handed back for replacement: ' + c.handed_back.join(', '));
    const fb = c.fallback;
    if (fb) {
      let f = 'on-demand fallback ' + fb.group + ': ' + (fb.final || (fb.changes || []).join(', ') || 'not used');
      if (fb.job_seconds > 0) {
        f += ', kept the job going ' + fmtDuration(fb.job_seconds) + ' on ' + (fb.host_hours || 0).toFixed(2) + ' host-hours';
        if (isNum(fb.cost)) f += ' for ' + fmtMoney(fb.cost, fb.currency || cur);
      }
      parts.push(f);
    }
    line.textContent = parts.join(' · ');
  }

  function render(s) {
    renderHeader(s);
    renderStats(s);
    // The panels first, the charts last: a chart takes the height its row has once the cost
    // panel beside it is filled in.
    renderCost(s);
    renderHosts(s);
    renderEvents(s);
    renderCharts(s);
  }

  // ---- connection ----

  function setConn(state, text) {
    const c = byId('conn-state');
    c.dataset.state = state;
    c.textContent = text;
    document.body.classList.toggle('stale', state === 'down');
  }

  function describe(err) {
    if (err && err.name === 'AbortError') return 'no answer in ' + FETCH_TIMEOUT_MS / 1000 + ' s';
    if (err instanceof TypeError) return 'connection failed';
    return (err && err.message) || String(err);
  }

  async function fetchStatus() {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      let url = 'v1/status?limit=' + HOSTS_PAGE + '&offset=' + hostsOffset;
      if (hostsState) url += '&state=' + encodeURIComponent(hostsState);
      const res = await fetch(url, {
        cache: 'no-store', headers: { Accept: 'application/json' }, signal: ctl.signal,
      });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      return await res.json();
    } finally {
      clearTimeout(timer);
    }
  }

  // schedule polls again in ms, or at once if the page asked for other hosts meanwhile.
  function schedule(ms) {
    polling = false;
    clearTimeout(pollTimer);
    pollTimer = setTimeout(tick, pollAgain ? 0 : ms);
    pollAgain = false;
  }

  async function tick() {
    polling = true;
    pollAgain = false;
    let s;
    try {
      s = await fetchStatus();
    } catch (err) {
      failures++;
      const delay = Math.min(MAX_BACKOFF_MS, POLL_MS * Math.pow(2, failures - 1));
      if (last && last.finished) {
        // A finished job's driver exits: its last state is final, not stale. Keep it.
        setConn('finished', 'job finished · the driver has stopped; this is the final state');
        schedule(MAX_BACKOFF_MS);
        return;
      }
      let text = 'driver unreachable — retrying in ' + Math.round(delay / 1000) + ' s (' + describe(err) + ')';
      if (last) text += ' · showing data from ' + fmtClock(new Date(lastAt).toISOString());
      setConn('down', text);
      schedule(delay);
      return;
    }
    failures = 0;
    try {
      render(s);
      last = s;
      lastAt = Date.now();
      setConn(s.finished ? 'finished' : 'ok', s.finished ? 'finished · checking every 5 s' : 'live');
      document.body.dataset.updated = s.now;
      document.body.dataset.ready = '1';
      // When the job was first drawn, from the navigation's start (bench scale reads it).
      if (!document.body.dataset.drawnMs) document.body.dataset.drawnMs = String(Math.round(performance.now()));
    } catch (err) {
      console.error(err);
      setConn('error', 'cannot show this status: ' + describe(err));
    }
    schedule(s && s.finished ? FINISHED_POLL_MS : POLL_MS);
  }

  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => { if (last) renderCharts(last); }, 100);
  });

  // The post-mortem report: the final status is in the page; draw it once, poll nothing.
  function showReport(script) {
    let s;
    try {
      s = JSON.parse(script.textContent);
      render(s);
    } catch (err) {
      console.error(err);
      setConn('error', 'cannot show this report: ' + describe(err));
      return;
    }
    last = s;
    const links = byId('links'); // report.html drops them: nothing to link to without the driver
    if (links) links.hidden = true;
    document.body.dataset.report = '1';
    setConn('finished', (s.finished ? 'report · job finished ' : 'report · status at ') + fmtDateTime(s.now));
    document.body.dataset.updated = s.now;
    document.body.dataset.ready = '1';
    // Drawn once: draw the charts again at the size the laid-out page gives them.
    requestAnimationFrame(() => renderCharts(s));
  }

  byId('hosts-prev').addEventListener('click', () => pageStep(-1));
  byId('hosts-next').addEventListener('click', () => pageStep(1));
  const embedded = byId('final-status');
  if (embedded) showReport(embedded);
  else tick();
})();
