// The plugin's pages: a task instance's output, a DAG run's inference tasks, a DAG's outputs by date.
// Reads the plugin's JSON API (same origin: the browser sends Airflow's cookie) and draws bars and charts.
"use strict";
(function () {
  const CFG = JSON.parse(document.getElementById("raybatch-config").textContent);
  const root = document.getElementById("root");
  const ACTIVE_TI = ["running", "queued", "scheduled", "deferred", "up_for_retry", "restarting"];
  const FAILED_TI = ["failed", "upstream_failed"];
  let timer = null;

  const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const num = (v) => (v === null || v === undefined ? "?" : Number(v).toLocaleString("en-US"));
  const compact = (v) => new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 }).format(v);
  const pct = (f) => (100 * (f || 0)).toFixed(1) + "%";
  const enc = encodeURIComponent;
  function dur(s) {
    if (s === null || s === undefined) return "?";
    s = Math.round(s);
    if (s < 60) return s + "s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + String(s % 60).padStart(2, "0") + "s";
    return Math.floor(m / 60) + "h " + String(m % 60).padStart(2, "0") + "m";
  }
  const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "?");
  const tiPath = (t) => `${CFG.base}/ti/${enc(t.dag_id)}/${enc(t.run_id)}/${enc(t.task_id)}?map_index=${t.map_index}`;

  async function getJSON(path, options) {
    const response = await fetch(CFG.base + path, Object.assign({ credentials: "same-origin" }, options || {}));
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(`${response.status} ${body.detail || response.statusText}`);
    return body;
  }

  // A state for a person: the output's, unless the task instance failed or never ran.
  function lineState(line) {
    const ti = line.task.state;
    if (FAILED_TI.includes(ti)) return "failed";
    if (!line.found) return ti ? (ACTIVE_TI.includes(ti) ? "running" : "none") : "none";
    return line.state === "not started" ? "not-started" : line.state;
  }
  const badge = (state, text) => `<span class="badge s-${esc(state)}">${esc(text || state)}</span>`;

  function bar(fraction, rejectedFraction, label, mini, id) {
    const f = Math.max(0, Math.min(1, fraction || 0));
    const r = Math.max(0, Math.min(f, rejectedFraction || 0));
    return `<div class="bar${mini ? " mini" : ""}"${id ? ` id="${id}"` : ""} data-fraction="${f.toFixed(6)}">` +
      `<div class="fill" style="width:${(100 * f).toFixed(3)}%"></div>` +
      (r > 0 ? `<div class="rej" style="left:${(100 * (f - r)).toFixed(3)}%;width:${(100 * r).toFixed(3)}%"></div>` : "") +
      `<div class="label">${esc(label)}</div></div>`;
  }

  // Which ranges are committed, in plan order: runs of equal characters as rectangles.
  function rangeStrip(mask) {
    if (!mask) return "";
    const n = mask.length;
    let rects = "";
    for (let i = 0; i < n;) {
      let j = i;
      while (j < n && mask[j] === mask[i]) j++;
      rects += `<rect x="${(100 * i) / n}%" width="${(100 * (j - i)) / n}%" y="0" height="14" fill="var(${mask[i] === "1" ? "--done" : "--none"})"/>`;
      i = j;
    }
    return `<svg id="range-strip" width="100%" height="14" role="img" aria-label="committed ranges">${rects}</svg>`;
  }

  // Rows done over time (the commit records' times), the planned total as a dashed line.
  function chart(timeline, planned) {
    if (!timeline || timeline.length === 0) return `<p class="muted">No commit yet.</p>`;
    const W = 640, H = 180, L = 60, B = 24, T = 8, R = 10;
    const t0 = timeline[0].time, t1 = Math.max(timeline[timeline.length - 1].time, t0 + 1);
    const ymax = Math.max(planned || 0, timeline[timeline.length - 1].rows, 1);
    const x = (t) => L + ((W - L - R) * (t - t0)) / (t1 - t0);
    const y = (v) => H - B - ((H - B - T) * v) / ymax;
    let d = `M${x(t0).toFixed(1)},${y(0).toFixed(1)}`;
    for (const p of timeline) d += ` L${x(p.time).toFixed(1)},${y(p.rows).toFixed(1)}`;
    return `<svg id="rows-chart" viewBox="0 0 ${W} ${H}" width="100%" style="max-width:${W}px" role="img" aria-label="rows committed over time">` +
      `<line x1="${L}" y1="${y(ymax)}" x2="${W - R}" y2="${y(ymax)}" stroke="var(--muted)" stroke-dasharray="4 3"/>` +
      `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="var(--line)"/>` +
      `<path d="${d}" fill="none" stroke="var(--run)" stroke-width="2"/>` +
      `<text x="${L - 6}" y="${y(ymax) + 4}" text-anchor="end">${esc(compact(ymax))}</text>` +
      `<text x="${L - 6}" y="${H - B + 4}" text-anchor="end">0</text>` +
      `<text x="${L}" y="${H - 6}">${esc(when(t0).slice(11))}</text>` +
      `<text x="${W - R}" y="${H - 6}" text-anchor="end">${esc(when(t1).slice(11))} (+${esc(dur(t1 - t0))})</text></svg>`;
  }

  function leaseCard(lease, title) {
    if (!lease) return "";
    const how = lease.released ? ["released", "--none"] : lease.holder_gone ? ["not released: its process has ended", "--failed"]
      : lease.live ? ["held", "--done"] : ["not released: heartbeat stale", "--partial"];
    const who = lease.task_id ? `${lease.dag_id} / ${lease.run_id} / ${lease.task_id}` + (lease.map_index !== null && lease.map_index >= 0 ? ` [${lease.map_index}]` : "") : lease.holder;
    return `<div class="card" id="lease"><span class="dot" style="background:var(${how[1]})"></span>${esc(title)}: <b>${esc(who)}</b>` +
      `try ${esc(lease.try_number ?? "?")} · host ${esc(lease.host)} · pid ${esc(lease.pid)} · heartbeat ${esc(dur(lease.heartbeat_age_s))} ago · ${esc(how[0])}</div>`;
  }

  function rejectsSection(o) {
    if (!o.rows_rejected) return `<h2>Rejects</h2><p class="muted">No rejected rows.</p>`;
    const engine = o.engine_errors, invalid = o.rows_rejected - engine;
    let html = `<h2>Rejects</h2><div class="cards"><div class="card"><b>${num(o.rows_rejected)}</b>rejected rows (${pct(o.rows_rejected / Math.max(1, o.rows_done))} of rows done)</div>` +
      `<div class="card" style="flex:1">${bar(invalid / o.rows_rejected, 0, `${num(invalid)} invalid input · ${num(engine)} engine errors`)}</div></div>`;
    const rows = (o.rejects && o.rejects.rows) || [];
    if (rows.length) {
      const cols = Object.keys(rows[0]).filter((c) => c !== "reason" && c !== "kind").slice(0, 4).concat(["kind", "reason"]);
      html += `<table id="rejects"><tr>${cols.map((c) => `<th>${esc(c)}</th>`).join("")}</tr>` +
        rows.map((r) => `<tr>${cols.map((c) => `<td class="${c === "reason" ? "" : "mono"}">${esc(typeof r[c] === "object" ? JSON.stringify(r[c]) : r[c])}</td>`).join("")}</tr>`).join("") +
        `</table>` + (o.rows_rejected > rows.length ? `<p class="muted">${rows.length} of ${num(o.rows_rejected)} shown (<span class="mono">raybatch rejects --export</span> for all).</p>` : "");
    }
    return html;
  }

  function planSection(o) {
    const files = o.files || [];
    if (!files.length) return "";
    const shown = files.slice(0, 100);
    return `<h2>Input plan</h2><p class="muted">${num(files.length)} files, ${num(o.ranges_planned)} ranges, ${num(o.rows_planned)} rows</p>` +
      `<table id="plan"><tr><th>file</th><th>rows</th><th>ranges</th><th>committed</th></tr>` +
      shown.map((f) => `<tr><td class="mono">${esc(f.relpath)}</td><td>${num(f.rows)}</td><td>${num(f.ranges)}</td>` +
        `<td>${bar(f.rows ? f.rows_done / f.rows : 0, 0, `${f.ranges_committed}/${f.ranges}`, true)}</td></tr>`).join("") +
      `</table>` + (files.length > shown.length ? `<p class="muted">and ${num(files.length - shown.length)} more files</p>` : "");
  }

  function outputSection(o, task) {
    const rejectedFraction = o.rows_planned ? o.rows_rejected / o.rows_planned : 0;
    let html = (o.writer ? `<h2>Table writer ${esc(o.writer)}, generation ${esc(o.generation)}</h2>` : "") +
      `<div class="cards"><div class="card"><b>${badge(o.state === "not started" ? "not-started" : o.state)}</b>output</div>` +
      `<div class="card"><b>${num(o.rows_done)} / ${num(o.rows_planned)}</b>rows done</div>` +
      `<div class="card"><b>${num(o.ranges_committed)} / ${num(o.ranges_planned)}</b>ranges committed</div>` +
      `<div class="card"><b>${o.rate_rows_per_s === null ? "–" : num(Math.round(o.rate_rows_per_s)) + " rows/s"}</b>current rate</div>` +
      `<div class="card"><b>${o.eta_s === null ? "–" : dur(o.eta_s)}</b>time left</div>` +
      (o.tokens_in === null || o.tokens_in === undefined ? "" :
        `<div class="card" id="tokens"><b>${num(o.tokens_in)} / ${num(o.tokens_out)}</b>tokens in / out (committed rows)</div>`) +
      `</div>` +
      bar(o.fraction_done, rejectedFraction, `${pct(o.fraction_done)} · ${num(o.rows_done)} of ${num(o.rows_planned)} rows`, false, "rows-bar") +
      `<div style="margin-top:4px">${rangeStrip(o.committed_mask)}</div>`;
    if (o.shard) {
      const p = o.shard, of = (planned) => (planned === null || planned === undefined ? "" : ` of ${num(planned)}`);
      html += `<p>This task instance's shard: ${num(p.ranges_committed)}${of(p.ranges_planned)} ranges, ${num(p.rows_committed)}${of(p.rows_planned)} rows committed.</p>`;
      if (p.rows_planned) html += bar(p.rows_committed / p.rows_planned, 0, `${pct(p.rows_committed / p.rows_planned)} of this shard`, true);
    }
    html += `<h2>Rows committed over time</h2>${chart(o.timeline, o.rows_planned)}`;
    html += `<h2>Writer</h2>` + (leaseCard(o.lease, "lease") || `<p class="muted">No lease taken.</p>`) +
      (o.shards || []).map((p) => leaseCard(p.lease, `shard ${p.key}`)).join("");
    if (o.state === "done") {
      const took = o.first_commit_at && o.last_commit_at ? o.last_commit_at - o.first_commit_at : null;
      html += `<h2>Summary</h2><div class="cards" id="summary"><div class="card"><b>${num(o.rows_planned)}</b>rows in</div>` +
        `<div class="card"><b>${num(o.rows_out)}</b>rows out</div><div class="card"><b>${num(o.rows_rejected)}</b>rejected (${num(o.engine_errors)} engine errors)</div>` +
        `<div class="card"><b>${dur(took)}</b>first to last commit</div>` +
        `<div class="card"><b>${took ? num(Math.round(o.rows_done / took)) : "–"} rows/s</b>on average</div></div>`;
    }
    html += rejectsSection(o) + planSection(o);
    return html;
  }

  async function tiView() {
    const t = CFG.task;
    const q = `/api/ti/${enc(t.dag_id)}/${enc(t.run_id)}/${enc(t.task_id)}?map_index=${t.map_index}`;
    let data;
    try { data = await getJSON(q); } catch (e) { root.innerHTML = `<p class="fault">${esc(e.message)}</p>`; return false; }
    const ti = data.task;
    let html = `<h1>${esc(ti.task_id)}${ti.map_index >= 0 ? ` [${ti.map_index}]` : ""} ${badge(lineState({ ...data, state: (data.outputs[0] || {}).state }), ti.state ? `task ${ti.state}` : "not run")}</h1>` +
      `<p class="muted">${esc(ti.run_id)} · try ${esc(ti.try_number ?? "–")} · <span class="mono">${esc(ti.path ?? "?")}</span> (${esc(ti.format)}${ti.partition ? " " + esc(JSON.stringify(ti.partition)) : ""}) · ` +
      `<a href="${esc(`${CFG.base}/run/${enc(ti.dag_id)}/${enc(ti.run_id)}`)}">DAG run</a> · <a href="${esc(`${CFG.base}/dag/${enc(ti.dag_id)}`)}">DAG</a></p>`;
    if (!data.found) html += `<p class="muted" id="message">${esc(data.message || "no output")}</p>`;
    html += data.outputs.map((o) => outputSection(o, ti)).join("");
    if (data.found) html += `<h2>Verify</h2><button id="verify">Run the verifier</button> <span id="verdict" class="muted"></span>`;
    html += `<p class="muted" id="read-at">read in ${esc(data.read_s ?? "?")} s at ${esc(new Date().toISOString().slice(11, 19))} UTC</p>`;
    root.innerHTML = html;
    const button = document.getElementById("verify");
    if (button) button.onclick = () => runVerify(q);
    const running = data.outputs.some((o) => o.state === "running") || ACTIVE_TI.includes(ti.state);
    return running;
  }

  async function runVerify(q) {
    const verdict = document.getElementById("verdict");
    verdict.textContent = "verifying…";
    try {
      const path = q.replace("?", "/verify?");
      const v = await getJSON(path, { method: "POST", headers: { "X-Raybatch-Action": "verify" } });
      verdict.className = v.ok ? "ok" : "fault";
      verdict.textContent = v.ok ? `OK: every planned range committed, every file as recorded, row keys unique (${v.seconds} s)`
        : v.message || `${v.faults.length} faults: ` + v.faults.slice(0, 5).join("; ");
    } catch (e) { verdict.className = "fault"; verdict.textContent = e.message; }
  }

  function lineRow(line) {
    const t = line.task, state = lineState(line);
    // A mapped task instance's bar is its own shard's, where the planning task recorded it.
    const own = line.shard && line.shard.rows_planned ? line.shard : null;
    const fraction = own ? own.rows_committed / own.rows_planned : line.fraction_done || 0;
    const label = own ? `${pct(fraction)} · ${num(own.rows_committed)}/${num(own.rows_planned)}`
      : line.found ? `${pct(line.fraction_done)} · ${num(line.rows_done)}/${num(line.rows_planned)}` : state === "none" ? "never run" : esc(t.state || "");
    const part = line.shard ? `${num(line.shard.rows_committed)} rows in ${num(line.shard.ranges_committed)} ranges` : "";
    return `<tr><td><a href="${esc(tiPath(t))}">${esc(t.task_id)}${t.map_index >= 0 ? ` [${t.map_index}]` : ""}</a></td><td>${badge(state)}</td>` +
      `<td style="width:40%">${bar(fraction, 0, label, true)}</td><td>${esc(part)}</td>` +
      `<td>${line.rate_rows_per_s ? num(Math.round(line.rate_rows_per_s)) + " rows/s" : ""}${line.eta_s ? ", " + dur(line.eta_s) + " left" : ""}</td></tr>`;
  }

  async function runView() {
    let data;
    try { data = await getJSON(`/api/run/${enc(CFG.dag_id)}/${enc(CFG.run_id)}`); } catch (e) { root.innerHTML = `<p class="fault">${esc(e.message)}</p>`; return false; }
    root.innerHTML = `<h1>${esc(CFG.dag_id)} · ${esc(CFG.run_id)}</h1>` +
      (data.lines.length ? `<table id="lines"><tr><th>task</th><th>state</th><th>progress</th><th>shard</th><th>rate</th></tr>${data.lines.map(lineRow).join("")}</table>`
        : `<p class="muted">No inference task of this provider in this DAG run.</p>`) +
      `<p><a href="${esc(`${CFG.base}/dag/${enc(CFG.dag_id)}`)}">All runs of ${esc(CFG.dag_id)}</a></p>`;
    return data.lines.some((l) => ["running"].includes(lineState(l)));
  }

  async function dagView() {
    let data;
    try { data = await getJSON(`/api/dag/${enc(CFG.dag_id)}`); } catch (e) { root.innerHTML = `<p class="fault">${esc(e.message)}</p>`; return false; }
    const colors = { done: "--done", running: "--run", partial: "--partial", failed: "--failed", none: "--none", "not-started": "--none" };
    let html = `<h1>${esc(CFG.dag_id)}: outputs by logical date</h1><p class="muted">` +
      Object.keys(colors).filter((k) => k !== "not-started").map((k) => `<span class="dot" style="background:var(${colors[k]})"></span>${k === "none" ? "never run" : k}`).join(" &nbsp; ") + `</p>`;
    if (!data.tasks.length) { root.innerHTML = html + `<p class="muted">No inference task of this provider in this DAG.</p>`; return false; }
    html += `<table class="grid" id="dag-grid"><tr><th>logical date</th>${data.tasks.map((t) => `<th>${esc(t)}</th>`).join("")}</tr>`;
    for (const run of data.runs) {
      html += `<tr><td class="mono" title="${esc(run.run_id)}"><a href="${esc(`${CFG.base}/run/${enc(CFG.dag_id)}/${enc(run.run_id)}`)}">${esc((run.logical_date || run.run_id).slice(0, 19))}</a></td>`;
      for (const task of data.tasks) {
        const line = run.cells[task];
        if (!line) { html += `<td class="cell"></td>`; continue; }
        const state = lineState(line);
        const text = state === "done" ? "done" : state === "partial" || state === "running" ? pct(line.fraction_done) : state === "failed" ? (line.found ? `failed ${pct(line.fraction_done)}` : "failed") : "never run";
        const fg = state === "none" || state === "not-started" ? "color:var(--text);" : "";
        html += `<td class="cell"><a class="cell" data-state="${esc(state)}" href="${esc(tiPath(line.task))}" style="${fg}background:var(${colors[state] || "--none"})">${esc(text)}</a></td>`;
      }
      html += `</tr>`;
    }
    root.innerHTML = html + `</table>`;
    return data.runs.some((r) => Object.values(r.cells).some((l) => lineState(l) === "running"));
  }

  async function refresh() {
    const view = { ti: tiView, run: runView, dag: dagView }[CFG.kind];
    const again = await view();
    clearTimeout(timer);
    if (again) timer = setTimeout(refresh, CFG.refresh_s * 1000);
  }
  refresh();
})();
