// The live page of an elasticd driver: polls v1/status (relative, so it works behind a path
// prefix) and redraws. Plain DOM, no libraries. Status strings (host IDs, messages) come from
// the cluster and are untrusted: they only ever go into textContent and attribute values.
'use strict';

(function () {
  const POLL_MS = 1000;           // while the job runs
  const FINISHED_POLL_MS = 5000;  // once it has finished: nothing changes much any more
  const MAX_BACKOFF_MS = 10000;   // between retries while the driver does not answer
  const FETCH_TIMEOUT_MS = 5000;  // a driver that accepts but never answers counts as down
  const SPARK_POINTS = 120;       // step-rate samples kept for the sparkline (one per poll)
  const CAUSES = ['failure', 'scale-up', 'removal', 'notice'];

  // The SVG namespace, taken from an <svg> the HTML parser made, so that no URL is spelled here.
  const SVG_NS = document.getElementById('world-chart').namespaceURI;

  let last = null;      // the last status drawn: kept while the driver is unreachable
  let lastAt = 0;       // when it was fetched (ms, client clock)
  let failures = 0;     // consecutive failed polls
  const rates = [];     // {now, rate}, oldest first

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

  function renderChart(s) {
    const svg = byId('world-chart');
    const box = svg.getBoundingClientRect();
    const W = Math.max(320, Math.round(box.width) || 640);
    const H = Math.max(180, Math.round(box.height) || 220);
    const m = { l: 40, r: 56, t: 14, b: 28 };
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    const kids = [];

    const hist = (s.world_history || []).filter((p) => !isNaN(Date.parse(p.at)));
    let t0 = Date.parse(s.started_at);
    let t1 = Date.parse(s.now);
    if (hist.length) {
      const first = Date.parse(hist[0].at);
      if (isNaN(t0) || first < t0) t0 = first;
    }
    if (isNaN(t1) || isNaN(t0)) t1 = t0 = Date.now();
    if (t1 - t0 < 1000) t1 = t0 + 1000;
    const ymax = Math.max(1, s.max_np || 0, ...hist.map((p) => p.world_size || 0));
    const x = (t) => m.l + ((t - t0) / (t1 - t0)) * (W - m.l - m.r);
    const y = (v) => m.t + (1 - v / ymax) * (H - m.t - m.b);

    // Axes and grid.
    const ystep = Math.max(1, niceStep(ymax, 4));
    for (let v = 0; v <= ymax + 1e-9; v += ystep) {
      kids.push(svgEl('line', { class: 'grid', x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }));
      kids.push(svgEl('text', { class: 'tick', x: m.l - 6, y: y(v) + 4, 'text-anchor': 'end' }, String(v)));
    }
    const span = (t1 - t0) / 1000;
    const tstep = TIME_STEPS.find((st) => span / st <= 6) || TIME_STEPS[TIME_STEPS.length - 1];
    for (let o = 0; o <= span + 1e-9; o += tstep) {
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
    const hosts = s.hosts || [];
    setText('hosts-count', hosts.length ? '(' + hosts.length + ')' : '');
    const rows = hosts.map((h) => {
      const tr = el('tr');
      tr.dataset.hostId = h.id;
      tr.dataset.state = h.state || '';
      const state = td('');
      state.append(badge('state', h.state));
      const life = td('');
      life.append(badge('lifecycle', h.lifecycle));
      const id = td('', 'id');
      id.append(el('code', '', h.id));
      const r = (ranks[h.id] || []).sort((a, b) => a - b);
      tr.append(
        id, td(h.addr || '—', 'addr'), state, life, td(h.type || '—'), td(h.zone || '—'),
        td(fmtInt(h.slots), 'num'),
        td(fmtInt(h.blacklisted_slots), h.blacklisted_slots > 0 ? 'num warn' : 'num'),
        td(r.length ? r.join(' ') : '—', 'ranks'),
        td(fmtMoney(h.price_per_hour, cur), 'num price'),
      );
      return tr;
    });
    if (!rows.length) rows.push(emptyRow('no hosts discovered yet', 10));
    byId('hosts').replaceChildren(...rows);
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
    setText('cost-total', fmtMoney(c.total, cur));
    setText('cost-spot', fmtMoney(c.spot, cur));
    setText('cost-on-demand', fmtMoney(c.on_demand, cur));
    setText('cost-od-equivalent', fmtMoney(c.on_demand_equivalent, cur));
    let savings = fmtMoney(c.savings, cur);
    if (isNum(c.savings) && isNum(c.savings_percent)) savings += ' (' + c.savings_percent.toFixed(1) + '%)';
    setText('savings', savings);
    byId('savings').dataset.sign = isNum(c.savings) ? String(Math.sign(c.savings)) : '';
    setText('rolled-back-cost', fmtMoney(c.rolled_back, cur));
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

    const unpriced = c.unpriced || [];
    const warn = byId('unpriced');
    warn.hidden = !unpriced.length;
    warn.textContent = unpriced.length
      ? 'No price for ' + unpriced.join(', ') + ' — give --prices. Their time is not in the totals.'
      : '';
  }

  function render(s) {
    renderHeader(s);
    renderStats(s);
    renderChart(s);
    renderHosts(s);
    renderEvents(s);
    renderCost(s);
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
      const res = await fetch('v1/status', {
        cache: 'no-store', headers: { Accept: 'application/json' }, signal: ctl.signal,
      });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      return await res.json();
    } finally {
      clearTimeout(timer);
    }
  }

  async function tick() {
    let s;
    try {
      s = await fetchStatus();
    } catch (err) {
      failures++;
      const delay = Math.min(MAX_BACKOFF_MS, POLL_MS * Math.pow(2, failures - 1));
      let text = 'driver unreachable — retrying in ' + Math.round(delay / 1000) + ' s (' + describe(err) + ')';
      if (last) text += ' · showing data from ' + fmtClock(new Date(lastAt).toISOString());
      setConn('down', text);
      setTimeout(tick, delay);
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
    } catch (err) {
      console.error(err);
      setConn('error', 'cannot show this status: ' + describe(err));
    }
    setTimeout(tick, s && s.finished ? FINISHED_POLL_MS : POLL_MS);
  }

  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => { if (last) renderChart(last); }, 100);
  });

  tick();
})();
