/* The trajectory browser's pages: overview, task, episode and compare, drawn from the data files that
   examples/tau2/eval/view.py writes. Every data file is a script that calls a function of `tau2View`
   (data/index.js, data/ep-N.js, data/search.js): browsers run <script src> from file://, where they refuse
   fetch(). An episode's file is added when the episode is opened, the search text on the first search. */
"use strict";

(function () {
  const state = {
    index: null, episodes: new Map(), waiting: new Map(), search: null, searchWaiting: [],
    selected: 0, rows: [], marked: [], page: "", routeStart: 0, overviewKey: "",
  };

  const api = {
    /** data/index.js: the overview's data (one short row per episode, columnar). */
    index(data) { state.index = prepare(data); route(); },
    /** data/ep-N.js: one episode's whole record. */
    episode(id, data) {
      state.episodes.set(id, data);
      (state.waiting.get(id) || []).forEach((done) => done(data));
      state.waiting.delete(id);
    },
    /** data/search.js: the lowercased text of every episode's messages, by episode id. */
    search(texts) {
      state.search = texts;
      state.searchWaiting.splice(0).forEach((done) => done());
    },
    last: null,
  };
  window.tau2View = api;

  const $ = (sel, root) => (root || document).querySelector(sel);
  const esc = (v) => String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g,
    (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));

  function addScript(src, onError) {
    const s = document.createElement("script");
    s.src = src;
    s.onerror = onError;
    document.head.appendChild(s);
  }

  function loadEpisode(id) {
    if (state.episodes.has(id)) return Promise.resolve(state.episodes.get(id));
    return new Promise((resolve, reject) => {
      const first = !state.waiting.has(id);
      if (first) state.waiting.set(id, []);
      state.waiting.get(id).push(resolve);
      if (first) addScript(`data/ep-${id}.js`, () => reject(new Error(`data/ep-${id}.js did not load`)));
    });
  }

  function loadSearch() {
    if (state.search) return Promise.resolve();
    return new Promise((resolve) => {
      if (state.searchWaiting.push(resolve) === 1) addScript("data/search.js");
    });
  }

  /** Per task its episodes, per (task, column) the counts the overview's cells and totals show. */
  function prepare(d) {
    const e = d.episodes, n = e.task.length, nc = d.columns.length;
    d.count = n;
    d.byTask = d.tasks.map(() => []);
    d.cells = new Map();
    const success = d.outcomes.indexOf("success"), rejected = d.outcomes.indexOf("rejected");
    for (let i = 0; i < n; i++) {
      d.byTask[e.task[i]].push(i);
      const key = e.task[i] * nc + e.column[i];
      let cell = d.cells.get(key);
      if (!cell) d.cells.set(key, cell = {n: 0, c: 0, r: 0});
      if (e.outcome[i] === rejected) cell.r++;
      else { cell.n++; if (e.outcome[i] === success) cell.c++; }
    }
    for (const ids of d.byTask) ids.sort((a, b) => e.column[a] - e.column[b] || (e.trial[a] ?? 0) - (e.trial[b] ?? 0) || a - b);
    d.domains = [...new Set(d.tasks.map((t) => t.domain))].sort();
    d.splits = [...new Set(d.tasks.flatMap((t) => t.splits))].sort();
    return d;
  }

  // ---- the address: #/path?filters; the filters travel with every page, so "back" keeps them
  function parseHash() {
    const [path, query] = (location.hash.replace(/^#/, "") || "/").split("?");
    return {parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "")};
  }
  const FILTERS = ["domain", "split", "outcome", "termination", "q"];
  function filters() {
    const p = parseHash().params, f = {};
    for (const k of FILTERS) f[k] = p.get(k) || "";
    return f;
  }
  function link(path, f) {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(f || filters())) if (v) p.set(k, v);
    const q = p.toString();
    return "#" + path + (q ? "?" + q : "");
  }

  function matches(i, f) {
    const d = state.index, e = d.episodes, task = d.tasks[e.task[i]];
    if (f.domain && task.domain !== f.domain) return false;
    if (f.split && !task.splits.includes(f.split)) return false;
    if (f.outcome && d.outcomes[e.outcome[i]] !== f.outcome) return false;
    if (f.termination && d.terminations[e.termination[i]] !== f.termination) return false;
    if (f.q && !(state.search && state.search[i].includes(f.q.toLowerCase()))) return false;
    return true;
  }

  function rendered(page) {
    state.page = page;
    api.last = {page, ms: performance.now() - state.routeStart, at: performance.now()};
    document.dispatchEvent(new CustomEvent("tau2view:rendered", {detail: api.last}));
  }

  function route() {
    if (!state.index) return;
    state.routeStart = performance.now();
    const {parts} = parseHash();
    const app = $("#app");
    if (parts[0] === "ep" && parts[1] !== undefined) return showEpisode(app, Number(parts[1]));
    if (parts[0] === "cmp" && parts.length === 3) return showCompare(app, Number(parts[1]), Number(parts[2]));
    if (parts[0] === "task" && parts[1] !== undefined) return showTask(app, Number(parts[1]));
    return showOverview(app);
  }
  window.addEventListener("hashchange", route);

  // ---- overview: a row per task, a column per step or run
  function showOverview(app) {
    const d = state.index, f = filters();
    document.title = d.title;
    $("#where").textContent = `${d.count} episodes · ${d.tasks.length} tasks · built ${d.built}`;
    const arriving = state.page !== "overview";
    if (arriving || !$("#filters")) {
      const opt = (vals, cur, all) => `<option value="">${all}</option>` +
        vals.map((v) => `<option${v === cur ? " selected" : ""}>${esc(v)}</option>`).join("");
      app.innerHTML = `<form id="filters" onsubmit="return false">
        <label>domain <select name="domain">${opt(d.domains, f.domain, "all")}</select></label>
        <label>split <select name="split">${opt(d.splits, f.split, "all")}</select></label>
        <label>outcome <select name="outcome">${opt(d.outcomes, f.outcome, "all")}</select></label>
        <label>termination <select name="termination">${opt(d.terminations, f.termination, "all")}</select></label>
        <label>messages <input name="q" type="search" placeholder="text in the messages" value="${esc(f.q)}"></label>
        <span id="shown"></span></form><div id="grid"></div>`;
      const form = $("#filters");
      const apply = () => {
        const nf = {};
        for (const k of FILTERS) nf[k] = form.elements[k].value.trim();
        history.replaceState(null, "", link("/", nf));
        state.selected = 0;
        showOverview(app);
      };
      form.addEventListener("change", apply);
      let timer = 0;
      form.elements.q.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(apply, 150); });
    }
    if (f.q && !state.search) {
      $("#shown").textContent = "loading the messages' text…";
      loadSearch().then(() => { if (state.page === "overview") showOverview(app); });
      return;
    }
    drawGrid(f, arriving ? state.task : undefined);
    rendered("overview");
  }

  function colour(rate) { return `hsl(${Math.round(rate * 120)}, 65%, 82%)`; }

  /** The table; `from` is the task a reader comes back from: its row is the selected one. */
  function drawGrid(f, from) {
    const d = state.index, nc = d.columns.length, any = FILTERS.some((k) => f[k]);
    const rows = [];
    for (let t = 0; t < d.tasks.length; t++) if (!any || d.byTask[t].some((i) => matches(i, f))) rows.push(t);
    state.rows = rows;
    if (from !== undefined) state.selected = Math.max(rows.indexOf(from), 0);
    state.selected = Math.min(state.selected, Math.max(rows.length - 1, 0));
    $("#shown").textContent = `${rows.length} of ${d.tasks.length} tasks`;
    const head = d.columns.map((c) => `<th title="${esc(c.title)}">${esc(c.label)}</th>`).join("");
    const body = rows.map((t, r) => {
      const task = d.tasks[t];
      const cells = d.columns.map((_, c) => {
        const cell = d.cells.get(t * nc + c);
        if (!cell) return "<td></td>";
        const style = cell.n ? ` style="background:${colour(cell.c / cell.n)}"` : "";
        const rej = cell.r ? ` <span class="rej" title="rejected">+${cell.r}✕</span>` : "";
        return `<td class="cell"${style} title="${cell.c} of ${cell.n} scored succeeded">${cell.c}/${cell.n}${rej}</td>`;
      }).join("");
      return `<tr class="task${r === state.selected ? " sel" : ""}" data-task="${t}"><th class="name">` +
        `<a href="${link(`/task/${t}`, f)}" title="${esc(task.domain)}/${esc(task.task_id)}">${esc(task.domain)}/${esc(task.task_id)}</a>` +
        (task.pays ? `<span class="pays" title="${esc(PAYS[task.pays])} (tau2_rl.sh check-tasks)">pays for ${task.pays}</span>` : "") +
        `<span class="splits">${esc(task.splits.join(" "))}</span></th>${cells}</tr>`;
    }).join("");
    const line = (use) => d.columns.map((_, c) => `<td>${passHat(use, c).map(([k, v, m]) =>
      `<div title="over ${m} tasks with at least ${k} scored trials">pass^${k} ${fmt(v)}</div>`).join("")}</td>`).join("");
    const trusted = rows.filter((t) => d.tasks[t].pays === "");
    const shares = d.columns.map((_, c) => {
      const [free, all] = stallShare(rows, c);
      return `<td title="${free} of ${all} successes">${all ? Math.round(100 * free / all) + " %" : "–"}</td>`;
    }).join("");
    const known = rows.some((t) => d.tasks[t].pays !== null && d.tasks[t].pays !== undefined);
    $("#grid").innerHTML = `<table id="overview"><thead><tr><th>task</th>${head}</tr></thead>` +
      `<tbody>${body}</tbody><tfoot><tr class="totals"><th>pass^k (shown tasks)</th>${line(rows)}</tr>` +
      (known ? `<tr class="totals trusted"><th title="the shown tasks that pay only for the job done">trusted pass^k (${trusted.length} tasks)</th>${line(trusted)}</tr>` +
        `<tr class="totals stall"><th title="the share of the successes on tasks a do-nothing agent passes">successes that pay for nothing</th>${shares}</tr>` : "") +
      `</tfoot></table>`;
    $("#grid").onclick = (ev) => {
      const tr = ev.target.closest("tr.task");
      if (tr && !ev.target.closest("a")) location.hash = link(`/task/${tr.dataset.task}`, f);
    };
  }

  const PAYS = {nothing: "a do-nothing agent passes this task", partial: "an agent that skips the last write passes this task"};

  /** Of one column's successes on the given tasks: those on tasks a do-nothing agent passes, and all. */
  function stallShare(rows, c) {
    const d = state.index, nc = d.columns.length;
    let free = 0, all = 0;
    for (const t of rows) {
      const cell = d.cells.get(t * nc + c);
      if (!cell) continue;
      all += cell.c;
      if (d.tasks[t].pays === "nothing") free += cell.c;
    }
    return [free, all];
  }

  function comb(n, k) { let r = 1; for (let i = 0; i < k; i++) r = r * (n - i) / (i + 1); return r; }

  /** τ²'s pass^k of one column over the given tasks: per task C(c,k)/C(n,k), averaged over the tasks
      with at least k scored trials (rejected ones are not trials), k = 1 up to 4. */
  function passHat(rows, c) {
    const d = state.index, nc = d.columns.length, cells = rows.map((t) => d.cells.get(t * nc + c)).filter((x) => x && x.n);
    const out = [];
    const most = Math.min(4, Math.max(0, ...cells.map((x) => x.n)));
    for (let k = 1; k <= most; k++) {
      const use = cells.filter((x) => x.n >= k);
      out.push([k, use.reduce((s, x) => s + comb(x.c, k) / comb(x.n, k), 0) / use.length, use.length]);
    }
    return out;
  }

  function move(delta) {
    const rows = [...document.querySelectorAll("tr.task, tr.ep")];
    if (!rows.length) return;
    state.selected = Math.max(0, Math.min(rows.length - 1, state.selected + delta));
    rows.forEach((r, i) => r.classList.toggle("sel", i === state.selected));
    rows[state.selected].scrollIntoView({block: "nearest"});
  }

  // ---- task: its episodes (those the filters keep), to open or to compare
  function taskEpisodes(t, f) {
    const keep = {...f, domain: "", split: ""};
    return state.index.byTask[t].filter((i) => matches(i, keep));
  }

  function describe(i) {
    const d = state.index, e = d.episodes;
    return {column: d.columns[e.column[i]].label, trial: e.trial[i], outcome: d.outcomes[e.outcome[i]],
            termination: d.terminations[e.termination[i]], reward: e.reward[i]};
  }

  function showTask(app, t) {
    const d = state.index, f = filters(), task = d.tasks[t];
    if (!task) { app.innerHTML = `<p class="error">No task ${esc(t)} in this site.</p>`; return rendered("task"); }
    if (f.q && !state.search) { loadSearch().then(route); app.innerHTML = `<p class="loading">Loading the messages' text…</p>`; return; }
    const ids = taskEpisodes(t, f);
    if (state.page !== "task" || state.task !== t) {
      state.selected = Math.max(ids.indexOf(state.episode), 0);
      state.marked = [];
    }
    state.task = t;
    $("#where").innerHTML = `<a href="${link("/")}">overview</a> › ${esc(task.domain)}/${esc(task.task_id)}`;
    const rows = ids.map((i, r) => {
      const x = describe(i);
      return `<tr class="ep${r === state.selected ? " sel" : ""}${state.marked.includes(i) ? " marked" : ""}" data-ep="${i}">` +
        `<td><a href="${link(`/ep/${i}`)}">#${i}</a></td><td>${esc(x.column)}</td><td>${esc(x.trial ?? "")}</td>` +
        `<td class="oc ${esc(x.outcome.split(" ")[0])}">${esc(x.outcome)}</td><td>${esc(x.termination)}</td>` +
        `<td>${fmt(x.reward)}</td></tr>`;
    }).join("");
    app.innerHTML = `<h1>${esc(task.domain)}/${esc(task.task_id)}</h1>
      <p>${ids.length} of ${d.byTask[t].length} episodes match the filters${FILTERS.some((k) => f[k]) ?
        ` (<a href="${link(`/task/${t}`, {})}">show all</a>)` : ""}. Mark two with x (or a click on their rows) to compare them.</p>
      <table id="episodes"><thead><tr><th>episode</th><th>column</th><th>trial</th><th>outcome</th>
      <th>termination</th><th>τ² reward</th></tr></thead><tbody>${rows}</tbody></table>`;
    $("#episodes").onclick = (ev) => {
      const tr = ev.target.closest("tr.ep");
      if (tr && !ev.target.closest("a")) mark(Number(tr.dataset.ep));
    };
    rendered("task");
  }

  function mark(i) {
    state.marked = state.marked.includes(i) ? state.marked.filter((x) => x !== i) : [...state.marked, i];
    document.querySelectorAll("tr.ep").forEach((r) => r.classList.toggle("marked", state.marked.includes(Number(r.dataset.ep))));
    if (state.marked.length === 2) location.hash = link(`/cmp/${state.marked[0]}/${state.marked[1]}`);
  }

  // ---- one episode: the conversation and its grade
  function when(ts) { const t = Date.parse(ts || ""); return Number.isNaN(t) ? null : t; }

  function messageMeta(m, prev) {
    const bits = [];
    if (m.turn_idx !== undefined && m.turn_idx !== null) bits.push(`turn ${m.turn_idx}`);
    const t = when(m.timestamp), p = prev ? when(prev.timestamp) : null;
    if (t !== null && p !== null) bits.push(`+${((t - p) / 1000).toFixed(2)} s`);
    const u = m.usage || {};
    if (u.prompt_tokens !== undefined || u.completion_tokens !== undefined) {
      bits.push(`${u.prompt_tokens ?? "?"} prompt / ${u.completion_tokens ?? "?"} completion tokens`);
    }
    if (m.cost) bits.push(`$${Number(m.cost).toFixed(4)}`);
    return bits.join(" · ");
  }

  function renderMessage(m, prev) {
    if (!m) return "";
    if (Array.isArray(m.tool_messages)) return m.tool_messages.map((x) => renderMessage(x, prev)).join("");
    const role = m.role || "?", meta = `<span class="meta">${esc(messageMeta(m, prev))}</span>`;
    if (role === "tool") {
      return `<div class="msg tool${m.error ? " error" : ""}"><div class="who">tool result → ${esc(m.requestor || "")}` +
        `${m.error ? " <b>error</b>" : ""} ${meta}</div><pre>${esc(pretty(m.content))}</pre></div>`;
    }
    const calls = (m.tool_calls || []).map((c) =>
      `<div class="call"><span class="fn">${esc(c.name)}</span><pre>${esc(JSON.stringify(c.arguments, null, 2))}</pre></div>`).join("");
    const text = m.content ? `<div class="text">${esc(m.content)}</div>` : "";
    return `<div class="msg ${esc(role)}"><div class="who">${esc(role)} ${meta}</div>${text}${calls}` +
      `${!text && !calls ? '<div class="text empty">(empty)</div>' : ""}</div>`;
  }

  function pretty(text) {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text ?? ""; }
  }

  function checkList(title, items, ok, label) {
    if (!items || !items.length) return "";
    return `<h3>${esc(title)}</h3><ul class="checks">${items.map((c, i) =>
      `<li class="${ok(c) ? "met" : "unmet"}">${ok(c) ? "✓" : "✗"} ${esc(label(c, i))}</li>`).join("")}</ul>`;
  }

  function call(a) {
    return `${a.name || a.func_name}(${Object.entries(a.arguments || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ")})`;
  }

  function gradePanel(ep) {
    const ri = ep.reward_info || {};
    const parts = [`<div class="oc big ${esc(ep.outcome.split(" ")[0])}">${esc(ep.outcome)}</div>`,
      `<table class="kv"><tr><th>τ² reward</th><td>${fmt(ep.tau2_reward)}</td></tr>` +
      `<tr><th>training reward</th><td>${fmt(ep.reward)}</td></tr>` +
      `<tr><th>termination</th><td>${esc(ep.termination)}</td></tr>` +
      (ep.trial !== null ? `<tr><th>trial / seed</th><td>${esc(ep.trial)} / ${esc(ep.seed ?? "")}</td></tr>` : "") +
      (ri.reward_basis ? `<tr><th>reward basis</th><td>${esc(ri.reward_basis.join(", "))}</td></tr>` : "") +
      (ri.reward_breakdown ? `<tr><th>breakdown</th><td>${esc(Object.entries(ri.reward_breakdown).map(([k, v]) => `${k} ${v}`).join(", "))}</td></tr>` : "") +
      `</table>`];
    if (ep.rejection) parts.push(`<p class="rejection">rejected (${esc(ep.rejection)}): ${esc(ep.rejection_detail)}</p>`);
    if (ep.note) parts.push(`<p class="note">${esc(ep.note)}</p>`);
    if (ep.failed && ep.failed.length) {
      parts.push(`<h3>failed</h3><ul class="failed">${ep.failed.map((x) => `<li>${esc(x)}</li>`).join("")}</ul>`);
    }
    if (ri.db_check) {
      parts.push(`<h3>database</h3><p class="db ${ri.db_check.db_match ? "met" : "unmet"}">` +
        `${ri.db_check.db_match ? "✓ end state matches the ground truth's" : "✗ end state differs from the ground truth's"}` +
        ` (db_reward ${fmt(ri.db_check.db_reward, 1)})</p>`);
    }
    const g = ep.grade || {};
    const diff = g.db_diff;
    if (diff && diff.rows && diff.rows.length) {
      parts.push(`<table class="dbdiff"><tr><th>table</th><th>key</th><th>field</th><th>got</th><th>expected</th></tr>` +
        diff.rows.map((r) => `<tr><td>${esc(r.db === "user" ? "user " + r.table : r.table)}</td><td>${esc(r.key ?? "")}</td>` +
          `<td>${esc(r.field ?? "(row)")}</td><td class="got">${esc(JSON.stringify(r.got))}</td>` +
          `<td class="expected">${esc(JSON.stringify(r.expected))}</td></tr>`).join("") +
        `</table>` + (diff.more ? `<p class="note">… and ${esc(diff.more)} more differences</p>` : ""));
    }
    const at = (list, i) => (list && list[i] && list[i].turn !== null && list[i].turn !== undefined
      ? ` (turn ${list[i].turn})` : "");
    parts.push(checkList("actions", ri.action_checks, (c) => c.action_match,
      (c, i) => call(c.action) + at(g.actions, i)));
    parts.push(checkList("communicate", ri.communicate_checks, (c) => c.met, (c, i) => c.info + at(g.communicate, i)));
    parts.push(checkList("environment assertions", ri.env_assertions, (c) => c.met, (c) => call(c.env_assertion)));
    parts.push(checkList("NL assertions", ri.nl_assertions, (c) => c.met, (c) => c.nl_assertion));
    const stats = Object.entries(ep.stats || {});
    if (stats.length) parts.push(`<h3>figures</h3><table class="kv">${stats.map(([k, v]) =>
      `<tr><th>${esc(k)}</th><td>${esc(Number.isInteger(v) ? v : fmt(v, 2))}</td></tr>`).join("")}</table>`);
    parts.push(`<p class="raw"><a id="raw" href="#" download="episode.json">raw JSON</a> <span class="path">${esc(ep.path)}</span></p>`);
    return parts.join("");
  }

  /** The episode's records as stored: the messages (written once in the data file) put back. */
  function rawRecord(ep) {
    const raw = JSON.parse(JSON.stringify(ep.raw || {}));
    for (const k of ["dump", "simulation"]) if (raw[k]) raw[k].messages = ep.messages;
    return raw;
  }

  function showEpisode(app, i) {
    const d = state.index, e = d.episodes;
    if (!(i >= 0 && i < d.count)) { app.innerHTML = `<p class="error">No episode ${esc(i)} in this site.</p>`; return rendered("episode"); }
    const f = filters(), t = e.task[i], task = d.tasks[t];
    if (f.q && !state.search) { loadSearch().then(route); app.innerHTML = `<p class="loading">Loading the messages' text…</p>`; return; }
    const list = taskEpisodes(t, f), at = list.indexOf(i);
    const prev = at > 0 ? list[at - 1] : null, next = at >= 0 && at < list.length - 1 ? list[at + 1] : null;
    state.neighbours = {prev, next};
    state.episode = i;
    state.task = t;
    $("#where").innerHTML = `<a href="${link("/")}">overview</a> › <a href="${link(`/task/${t}`)}">${esc(task.domain)}/${esc(task.task_id)}</a> › #${i}`;
    app.innerHTML = `<p class="loading">Loading episode ${i}…</p>`;
    loadEpisode(i).then((ep) => {
      if (parseHash().parts[1] !== String(i)) return;
      const x = describe(i);
      const others = d.byTask[t].filter((j) => j !== i).map((j) => {
        const y = describe(j);
        return `<option value="${j}">#${j} ${esc(y.column)} trial ${esc(y.trial ?? "")} ${esc(y.outcome)}</option>`;
      }).join("");
      const msgs = ep.messages.map((m, k) => renderMessage(m, ep.messages[k - 1])).join("");
      app.innerHTML = `<h1>${esc(ep.domain)}/${esc(ep.task_id)} <small>#${i} · ${esc(x.column)}` +
        `${ep.trial !== null ? ` · trial ${esc(ep.trial)}` : ""}</small></h1>
        <nav class="pager">${prev !== null ? `<a href="${link(`/ep/${prev}`)}">← #${prev} (k)</a>` : ""}
        ${next !== null ? `<a href="${link(`/ep/${next}`)}">#${next} (j) →</a>` : ""}
        ${others ? `<label>compare with <select id="cmpwith"><option value=""></option>${others}</select></label>` : ""}</nav>
        <div class="episode"><section class="timeline">${msgs || '<p class="empty">No messages (a rejected trial leaves none).</p>'}</section>
        <aside class="grade">${gradePanel(ep)}</aside></div>`;
      const raw = $("#raw");
      raw.href = URL.createObjectURL(new Blob([JSON.stringify(rawRecord(ep), null, 2)], {type: "application/json"}));
      raw.download = `episode-${i}.json`;
      const sel = $("#cmpwith");
      if (sel) sel.onchange = () => { if (sel.value) location.hash = link(`/cmp/${i}/${sel.value}`); };
      rendered("episode");
    }, (err) => { app.innerHTML = `<p class="error">${esc(err.message)}</p>`; rendered("episode"); });
  }

  // ---- compare: two episodes of one task side by side, aligned by turn
  function messageKey(m) {
    if (!m) return "";
    const calls = (m.tool_calls || []).map((c) => [c.name, c.arguments]);
    return JSON.stringify([m.role, m.content || "", calls, Boolean(m.error)]);
  }

  function showCompare(app, a, b) {
    const d = state.index, e = d.episodes;
    if (![a, b].every((i) => i >= 0 && i < d.count)) { app.innerHTML = `<p class="error">No such episodes.</p>`; return rendered("compare"); }
    const t = e.task[a], task = d.tasks[t];
    $("#where").innerHTML = `<a href="${link("/")}">overview</a> › <a href="${link(`/task/${t}`)}">${esc(task.domain)}/${esc(task.task_id)}</a> › #${a} vs #${b}`;
    app.innerHTML = `<p class="loading">Loading episodes ${a} and ${b}…</p>`;
    Promise.all([loadEpisode(a), loadEpisode(b)]).then(([x, y]) => {
      if (e.task[b] !== t) { app.innerHTML = `<p class="error">#${a} and #${b} are episodes of different tasks.</p>`; return rendered("compare"); }
      const n = Math.max(x.messages.length, y.messages.length);
      let first = -1;
      const rows = [];
      for (let k = 0; k < n; k++) {
        const mx = x.messages[k], my = y.messages[k], same = messageKey(mx) === messageKey(my);
        if (!same && first < 0) first = k;
        rows.push(`<tr class="${same ? "same" : "diff"}${k === first ? " first-diff" : ""}" data-turn="${k}">` +
          `<th>${k}${k === first ? '<div class="flag">first difference</div>' : ""}</th>` +
          `<td>${renderMessage(mx, x.messages[k - 1])}</td><td>${renderMessage(my, y.messages[k - 1])}</td></tr>`);
      }
      const head = (i, ep) => `<th><a href="${link(`/ep/${i}`)}">#${i}</a> ${esc(describe(i).column)}` +
        `${ep.trial !== null ? ` trial ${esc(ep.trial)}` : ""} · <span class="oc ${esc(ep.outcome.split(" ")[0])}">${esc(ep.outcome)}</span>` +
        ` · τ² ${fmt(ep.tau2_reward)}${ep.failed.length ? `<ul class="failed">${ep.failed.map((f) => `<li>${esc(f)}</li>`).join("")}</ul>` : ""}</th>`;
      app.innerHTML = `<h1>${esc(task.domain)}/${esc(task.task_id)} <small>#${a} vs #${b}</small></h1>
        <p id="firstdiff">${first < 0 ? "The two conversations are the same, turn for turn." :
          `They differ first at turn ${first} <button type="button" id="gofirst">show it</button>`}</p>
        <table id="compare"><thead><tr><th>turn</th>${head(a, x)}${head(b, y)}</tr></thead><tbody>${rows.join("")}</tbody></table>`;
      const go = $("#gofirst");
      if (go) go.onclick = () => $("tr.first-diff").scrollIntoView({block: "center"});
      rendered("compare");
    }, (err) => { app.innerHTML = `<p class="error">${esc(err.message)}</p>`; rendered("compare"); });
  }

  // ---- keyboard: j/k or arrows move, Enter opens, x marks, u / Esc / Backspace go up, / searches
  function up() {
    const {parts} = parseHash();
    if (parts[0] === "ep" || parts[0] === "cmp") location.hash = link(`/task/${state.index.episodes.task[Number(parts[1])]}`);
    else if (parts[0] === "task") location.hash = link("/");
  }

  document.addEventListener("keydown", (ev) => {
    if (!state.index || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const typing = ev.target.closest && ev.target.closest("input, select, textarea");
    if (typing) { if (ev.key === "Escape") ev.target.blur(); return; }
    const page = state.page, key = ev.key;
    if (key === "/" && $("#filters")) { ev.preventDefault(); $("#filters").elements.q.focus(); return; }
    if (["u", "Escape", "Backspace"].includes(key)) { ev.preventDefault(); return up(); }
    if (page === "episode" && state.neighbours) {
      const target = {j: "next", ArrowDown: "next", ArrowRight: "next", k: "prev", ArrowUp: "prev", ArrowLeft: "prev"}[key];
      if (target && state.neighbours[target] !== null) { ev.preventDefault(); location.hash = link(`/ep/${state.neighbours[target]}`); }
      return;
    }
    if (page !== "overview" && page !== "task") return;
    if (key === "j" || key === "ArrowDown") { ev.preventDefault(); move(1); }
    else if (key === "k" || key === "ArrowUp") { ev.preventDefault(); move(-1); }
    else if (key === "Enter") {
      const row = document.querySelectorAll("tr.task, tr.ep")[state.selected];
      if (row) location.hash = page === "overview" ? link(`/task/${row.dataset.task}`) : link(`/ep/${row.dataset.ep}`);
    } else if (key === "x" && page === "task") {
      const row = document.querySelectorAll("tr.ep")[state.selected];
      if (row) mark(Number(row.dataset.ep));
    }
  });
})();
