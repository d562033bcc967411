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
    if (s === null || s === undefined) return "–";
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
  const plural = (n, word, words) => `${num(n)} ${n === 1 ? word : words || word + "s"}`;
  const rate = (v) => (v === null || v === undefined ? "–" : num(Math.round(v)) + " rows/s");
  const card = (value, label, id) => `<div class="card"${id ? ` id="${id}"` : ""}><b>${value}</b>${esc(label)}</div>`;
  const key = (color, text) => `<span class="key"><span class="dot" style="background:var(${color})"></span>${esc(text)}</span> `;

  // Stacked segments ([fraction, colour variable], from the left) over the grey of what is not done.
  function bar(segments, label, mini, id) {
    let left = 0, fills = "";
    for (const [fraction, color] of segments) {
      const width = Math.max(0, Math.min(1 - left, fraction || 0));
      if (width > 0) fills += `<div class="fill" style="left:${(100 * left).toFixed(3)}%;width:${(100 * width).toFixed(3)}%;background:var(${color})"></div>`;
      left += width;
    }
    return `<div class="bar${mini ? " mini" : ""}"${id ? ` id="${id}"` : ""} data-fraction="${left.toFixed(6)}">${fills}` +
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

  // The lease: who holds it, or held it last (a no-op rerun takes it too: it names no writer).
  function leaseCard(lease, title) {
    if (!lease) return "";
    const how = lease.released ? ["released", "--none"] : lease.holder_gone ? ["not released: its process has ended", "--failed"]
      : lease.live ? ["held", "--done"] : ["not released: heartbeat stale", "--partial"];
    const who = lease.task_id ? `${lease.dag_id} / ${lease.run_id} / ${lease.task_id}` + (lease.map_index !== null && lease.map_index >= 0 ? ` [${lease.map_index}]` : "") : lease.holder;
    return `<div class="card lease"><span class="dot" style="background:var(${how[1]})"></span>${esc(title)} ${lease.live ? "held" : "last held"} by <b>${esc(who)}</b>` +
      `try ${esc(lease.try_number ?? "?")} · host ${esc(lease.host)} · pid ${esc(lease.pid)} · heartbeat ${esc(dur(lease.heartbeat_age_s))} ago · ${esc(how[0])}</div>`;
  }

  // What this try did (the API's `try`): committed, skipped as committed before it (by whom), refused or failed (why).
  const OUTCOME_STATE = { wrote: "done", "nothing to do": "done", refused: "failed", failed: "failed", running: "running", queued: "none" };
  function trySection(t) {
    if (t === undefined) return ""; // an api-server that does not tell a try's story
    let html = `<h2>This try</h2>`;
    if (t === null) return html + `<p class="muted" id="try">This task instance has not run yet.</p>`;
    const rows = (n) => plural(n, "row");
    const story = {
      wrote: `Committed ${plural(t.ranges_committed, "range")} (${rows(t.rows_committed)}, ${num(t.rows_rejected)} of them rejected).`,
      "nothing to do": "Nothing to do: every planned range was committed before this try.",
      refused: `Refused: ${t.message || "no reason recorded"}`,
      failed: `Failed: ${t.message || "no reason recorded"}`,
      running: `Running: ${plural(t.ranges_committed, "range")} (${rows(t.rows_committed)}) committed so far.`,
      queued: "Queued: not started yet.",
    }[t.outcome] || `${t.outcome}.`;
    html += `<div class="story ${OUTCOME_STATE[t.outcome] === "failed" ? "bad" : ""}" id="try"><p>${esc(story)}</p>`;
    if (t.ranges_skipped) {
      const by = t.skipped_by || [];
      html += `<p>Skipped ${plural(t.ranges_skipped, "range")} (${rows(t.rows_skipped)}) committed before this try, by ` +
        (by.length ? `</p><ul>${by.map((b) => `<li>${esc(b.writer)}: ${plural(b.ranges, "range")}, ${rows(b.rows)}</li>`).join("")}</ul>` : "a writer unknown (recorded by an older release).</p>");
    }
    html += `</div>`;
    if (t.outcome === "queued") return html;
    return html + `<div class="cards" id="try-figures">` +
      card(num(t.rows_committed), "rows committed by this try") + card(num(t.rows_rejected), "of them rejected") +
      card(num(t.rows_skipped), "rows skipped (committed before)") + card(dur(t.wall_s), "wall time") +
      card(rate(t.scoring_rows_per_s), "scoring rate") + card(rate(t.commit_rows_per_s), "commit rate") + `</div>`;
  }

  function rejectsSection(o) {
    if (!o.rows_rejected) return `<h2>Rejects</h2><p class="muted">No rejected rows.</p>`;
    const engine = o.engine_errors, invalid = o.rows_rejected - engine;
    let html = `<h2>Rejects</h2><div class="cards">${card(num(o.rows_rejected), `rejected rows (${pct(o.rows_rejected / Math.max(1, o.rows_done))} of rows done)`)}` +
      `<div class="card" style="flex:1">${bar([[invalid / o.rows_rejected, "--reject"], [engine / o.rows_rejected, "--failed"]],
        `${plural(invalid, "invalid input", "invalid inputs")} · ${plural(engine, "engine error")}`, false, "rejects-bar")}` +
      `<div class="legend">${key("--reject", "invalid input")}${key("--failed", "engine error")}</div></div></div>`;
    const rows = (o.rejects && o.rejects.rows) || [];
    if (rows.length) {
      const cols = Object.keys(rows[0]).filter((c) => c !== "reason" && c !== "kind").slice(0, 4).concat(["kind", "reason"]);
      html += `<table id="rejects"><tr>${cols.map((c) => `<th>${esc(c)}</th>`).join("")}</tr>` +
        rows.map((r) => `<tr>${cols.map((c) => `<td class="${c === "reason" ? "" : "mono"}">${esc(typeof r[c] === "object" ? JSON.stringify(r[c]) : r[c])}</td>`).join("")}</tr>`).join("") +
        `</table>` + (o.rows_rejected > rows.length ? `<p class="muted">${num(rows.length)} of ${num(o.rows_rejected)} shown (<span class="mono">raybatch rejects --export</span> for all).</p>` : "");
    }
    return html;
  }

  function planSection(o) {
    const files = o.files || [];
    if (!files.length) return "";
    const shown = files.slice(0, 100);
    return `<h2>Input plan</h2><p class="muted" id="plan-size">${plural(files.length, "file")}, ${plural(o.ranges_planned, "range")}, ${plural(o.rows_planned, "row")}</p>` +
      `<table id="plan"><tr><th>file</th><th>rows</th><th>ranges</th><th>committed</th></tr>` +
      shown.map((f) => `<tr><td class="mono">${esc(f.relpath)}</td><td>${num(f.rows)}</td><td>${num(f.ranges)}</td>` +
        `<td>${bar([[f.rows ? f.rows_done / f.rows : 0, "--done"]], `${f.ranges_committed}/${f.ranges}`, true)}</td></tr>`).join("") +
      `</table>` + (files.length > shown.length ? `<p class="muted">and ${plural(files.length - shown.length, "more file", "more files")}</p>` : "");
  }

  // The output: what every try together committed, read from its ledger (labelled as the output's).
  function outputSection(o) {
    const of = (n) => (o.rows_planned ? n / o.rows_planned : 0);
    const segments = o.rows_planned ? [[of(o.rows_out), "--done"], [of(o.rows_rejected), "--reject"]] : [[o.fraction_done, "--done"]];
    const writer = o.last_writer ? esc(o.last_writer.describe) : o.ranges_committed ? "writer unknown" : "none yet";
    let html = `<h2>The output${o.writer ? `: table writer ${esc(o.writer)}, generation ${esc(o.generation)}` : ""} (all tries)</h2>` +
      `<div class="cards">${card(badge(o.state === "not started" ? "not-started" : o.state), "output")}` +
      card(`${num(o.rows_done)} / ${num(o.rows_planned)}`, "rows done") +
      card(`${num(o.ranges_committed)} / ${num(o.ranges_planned)}`, "ranges committed") +
      card(rate(o.commit_rows_per_s), "commit rate, current") + card(dur(o.eta_s), "time left") +
      (o.tokens_in === null || o.tokens_in === undefined ? "" : card(`${num(o.tokens_in)} / ${num(o.tokens_out)}`, "tokens in / out (committed rows)", "tokens")) +
      (o.truncated_rows === null || o.truncated_rows === undefined ? "" : card(num(o.truncated_rows), "rows truncated (committed rows)", "truncated")) +
      `</div>` +
      bar(segments, `${pct(o.fraction_done)} · ${num(o.rows_done)} of ${num(o.rows_planned)} rows`, false, "rows-bar") +
      `<div class="legend" id="rows-legend">rows: ${key("--done", "written")}${key("--reject", "rejected")}${key("--none", "not done yet")}</div>` +
      (o.committed_mask ? `<div style="margin-top:6px">${rangeStrip(o.committed_mask)}</div>` +
        `<div class="legend" id="ranges-legend">${plural(o.ranges_planned, "planned range")}, in plan order: ${key("--done", "committed")}${key("--none", "not committed")}</div>` : "");
    if (o.shard) {
      const p = o.shard, ofPlanned = (planned) => (planned === null || planned === undefined ? "" : ` of ${num(planned)}`);
      html += `<p>This task instance's shard: ${num(p.ranges_committed)}${ofPlanned(p.ranges_planned)} ranges, ${num(p.rows_committed)}${ofPlanned(p.rows_planned)} rows committed.</p>`;
      if (p.rows_planned) html += bar([[p.rows_committed / p.rows_planned, "--done"]], `${pct(p.rows_committed / p.rows_planned)} of this shard`, true);
    }
    html += `<h2>Rows committed over time</h2>${chart(o.timeline, o.rows_planned)}`;
    html += `<h2>Writer</h2><p id="last-writer">Newest range committed by: <b>${writer}</b></p>` +
      (leaseCard(o.lease, "Lease") || `<p class="muted">No lease taken.</p>`) +
      (o.shards || []).map((p) => leaseCard(p.lease, `Shard ${p.key}'s lease`)).join("");
    if (o.state === "done") {
      html += `<h2>Summary</h2><div class="cards" id="summary">${card(num(o.rows_planned), "rows in")}${card(num(o.rows_out), "rows out")}` +
        card(num(o.rows_rejected), `rejected (${plural(o.engine_errors, "engine error")})`) +
        card(rate(o.average_commit_rows_per_s), "commit rate, average") + `</div>`;
    }
    return html + rejectsSection(o) + planSection(o);
  }

  // The verifier's answer is the page's, not the refresh's: kept here and drawn on every refresh
  // until dismissed or asked again (`asked` numbers the questions: a late answer to an old one is dropped).
  let verdict = null, asked = 0;
  function verifyBox() {
    let answer = "";
    if (verdict) {
      const dismiss = verdict.pending ? "" : ` <button type="button" class="link" id="dismiss">dismiss</button>`;
      answer = `<span id="verdict" class="verdict ${verdict.kind}">${esc(verdict.text)}</span>${dismiss}`;
    }
    return `<div id="verify-box"><button type="button" id="verify"${verdict && verdict.pending ? " disabled" : ""}>Run the verifier</button>${answer}</div>`;
  }
  function drawVerdict(v) {
    verdict = v;
    const box = document.getElementById("verify-box");
    if (box) box.outerHTML = verifyBox();
  }
  function verdictOf(v) {
    const at = ` (checked at ${new Date().toISOString().slice(11, 19)} UTC${v.seconds === undefined ? "" : `, ${v.seconds} s`})`;
    if (v.ok) return { kind: "ok", text: `OK: every planned range committed, every file as recorded, row keys unique${at}` };
    if (v.unfinished || v.ok === null) return { kind: "pending", text: v.message + at };
    return { kind: "fault", text: (v.message || `${plural(v.faults.length, "fault")}: ${v.faults.slice(0, 5).join("; ")}`) + at };
  }
  async function runVerify(q) {
    const question = ++asked;
    drawVerdict({ kind: "pending", text: "verifying…", pending: true });
    let answer;
    try {
      answer = verdictOf(await getJSON(q.replace("?", "/verify?"), { method: "POST", headers: { "X-Raybatch-Action": "verify" } }));
    } catch (e) { answer = { kind: "fault", text: e.message }; }
    if (question === asked) drawVerdict(answer);
  }

  async function tiView() {
    const t = CFG.task;
    const q = `/api/ti/${enc(t.dag_id)}/${enc(t.run_id)}/${enc(t.task_id)}?map_index=${t.map_index}`;
    let data;
    try { data = await getJSON(q); } catch (e) { root.innerHTML = `<p class="fault">${esc(e.message)}</p>`; return false; }
    const ti = data.task, story = data.try;
    const heading = story ? badge(OUTCOME_STATE[story.outcome] || "none", story.outcome)
      : story === null ? badge("none", "not run") : badge(lineState({ ...data, state: (data.outputs[0] || {}).state }), ti.state ? `task ${ti.state}` : "not run");
    const where = ti.path ? `<span class="mono">${esc(ti.path)}</span> (${esc(ti.format)}${ti.partition ? " " + esc(JSON.stringify(ti.partition)) : ""})` : "output path not known yet";
    let html = `<h1>${esc(ti.task_id)}${ti.map_index >= 0 ? ` [${ti.map_index}]` : ""} ${heading}</h1>` +
      `<p class="muted">${esc(ti.run_id)} · try ${esc(ti.try_number ?? "–")}${ti.state ? ` (Airflow: ${esc(ti.state)})` : ""} · ${where} · ` +
      `<a href="${esc(`${CFG.base}/run/${enc(ti.dag_id)}/${enc(ti.run_id)}`)}">DAG run</a> · <a href="${esc(`${CFG.base}/dag/${enc(ti.dag_id)}`)}">DAG</a></p>`;
    html += trySection(story);
    if (!data.found) html += `<p class="muted" id="message">${esc(data.message || "no output")}</p>`;
    html += data.outputs.map(outputSection).join("");
    if (data.found) html += `<h2>Verify</h2>${verifyBox()}`;
    const read = data.read_s === null || data.read_s === undefined ? "" : ` in ${data.read_s} s`;
    html += `<p class="muted" id="read-at">read at ${esc(new Date().toISOString().slice(11, 19))} UTC${esc(read)}</p>`;
    root.innerHTML = html;
    root.dataset.draws = Number(root.dataset.draws || 0) + 1; // a refresh a test can wait for
    root.onclick = (e) => {
      if (e.target.id === "verify") runVerify(q);
      else if (e.target.id === "dismiss") { asked++; drawVerdict(null); }
    };
    return data.outputs.some((o) => o.state === "running") || ACTIVE_TI.includes(ti.state);
  }

  function lineRow(line) {
    const t = line.task, state = lineState(line);
    // A mapped task instance's bar is its own shard's, where the planning task recorded it.
    const own = line.shard && line.shard.rows_planned ? line.shard : null;
    const fraction = own ? own.rows_committed / own.rows_planned : line.fraction_done || 0;
    const label = own ? `${pct(fraction)} · ${num(own.rows_committed)}/${num(own.rows_planned)}`
      : line.found ? `${pct(line.fraction_done)} · ${num(line.rows_done)}/${num(line.rows_planned)}` : state === "none" ? "never run" : t.state || "";
    const part = line.shard ? `${plural(line.shard.rows_committed, "row")} in ${plural(line.shard.ranges_committed, "range")}` : "";
    return `<tr><td><a href="${esc(tiPath(t))}">${esc(t.task_id)}${t.map_index >= 0 ? ` [${t.map_index}]` : ""}</a></td><td>${badge(state)}</td>` +
      `<td style="width:40%">${bar([[fraction, "--done"]], label, true)}</td><td>${esc(part)}</td>` +
      `<td>${line.commit_rows_per_s ? rate(line.commit_rows_per_s) : ""}${line.eta_s ? ", " + dur(line.eta_s) + " left" : ""}</td></tr>`;
  }

  async function runView() {
    let data;
    try { data = await getJSON(`/api/run/${enc(CFG.dag_id)}/${enc(CFG.run_id)}`); } catch (e) { root.innerHTML = `<p class="fault">${esc(e.message)}</p>`; return false; }
    root.innerHTML = `<h1>${esc(CFG.dag_id)} · ${esc(CFG.run_id)}</h1>` +
      (data.lines.length ? `<table id="lines"><tr><th>task</th><th>state</th><th>progress</th><th>shard</th><th>commit rate, time left</th></tr>${data.lines.map(lineRow).join("")}</table>`
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
