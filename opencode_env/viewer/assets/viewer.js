/* The rollout viewer: renders one RolloutResult (parsed JSON) into a container. Every piece of the result is
   hostile text: it only ever reaches the page through textContent / text nodes, never as markup or a URL. */
(function () {
  "use strict";

  const PHASES = ["sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect", "close"];
  const PHASE_COLOURS = ["#8250df", "#bf3989", "#6e7781", "#0969da", "#1b7c83", "#1a7f37", "#bc4c00", "#9a6700", "#57606a"];
  const KNOWN = new Set([
    "task_id", "sandbox_id", "reward", "agent_exit_code", "wall_s", "mode", "setup_results", "verify_results",
    "proxy_turns", "files", "files_extra", "agent_log_tail", "proxy_log_tail", "error", "status", "failed_phase",
    "timings", "reward_source", "usage", "backend", "opencode_version", "upstream", "tool_calls", "agent_final_text",
    "request_tools", "oracle", "solution_results", "limits_hit", "enforcement", "schema_version", "files_non_utf8",
    "task", "warnings", "provenance", "integrity", "test_outcomes",
  ]);
  const TOKENS_PER_CHUNK = 2000;
  const provenanceText = (p) => {
    const model = obj(obj(p.endpoint).model);
    const bits = [
      p.capture ? "capture " + p.capture : null,
      model.root ? "weights " + model.root : null,
      p.policy_version ? "policy " + p.policy_version : null,
      p.template_fingerprint ? "template " + p.template_fingerprint : null,
      arr(p.template_changed_turns).length ? "template changed at turns " + arr(p.template_changed_turns).join(", ") : null,
      p.config_sha256 ? "config " + String(p.config_sha256).slice(0, 19) : null,
    ];
    return bits.filter(Boolean).join(" · ") || "–";
  };
  let closePopup = () => {};
  document.addEventListener("keydown", (event) => { if (event.key === "Escape") closePopup(); });
  const MESSAGE_PREVIEW = 120;

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key === "open") node.open = true;
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const isNum = (x) => typeof x === "number" && Number.isFinite(x);
  // Non-finite floats travel as the strings "Infinity", "-Infinity" and "NaN" (standard JSON has no literal for them).
  const wireFloat = (x) => (x === "Infinity" || x === "-Infinity" || x === "NaN" ? Number(x) : x);
  const secs = (x) => (isNum(x) ? x.toFixed(x < 10 ? 2 : 1) + " s" : "–");
  const text = (x) => (typeof x === "string" ? x : x === undefined || x === null ? "" : JSON.stringify(x, null, 2));
  const arr = (x) => (Array.isArray(x) ? x : []);
  const obj = (x) => (x && typeof x === "object" && !Array.isArray(x) ? x : {});

  /* A turn's per-token arrays may travel packed (schema_version 4 to 6; opencode_env/wire/token_packing.py): base64
     of little-endian int32 / float32 or float64 arrays, each token id's text once per result in `vocab` (texts.byId
     is the result's map, filled turn by turn in order); in version 5 a sampled token that is one of its own
     alternatives as its rank there (`sampled_rank`, int8; -1: read from `ids`/`logprobs`); in version 6 an
     alternative without an id as an index (`top_texts`, int16 or int32) into the result's table of texts
     (texts.table: every packed turn's `alt_texts`, in order). `ids` holds the positions ranked -1 or ranked to an
     alternative without an id, `logprobs` the positions ranked -1. */
  function littleEndian(b64, kind, count) {
    const bytes = Uint8Array.from(atob(b64 || ""), (c) => c.charCodeAt(0));
    const view = new DataView(bytes.buffer);
    const size = kind === "f64" ? 8 : kind === "i8" ? 1 : kind === "i16" ? 2 : 4;
    const read = kind === "i32" ? (o) => view.getInt32(o, true) : kind === "i16" ? (o) => view.getInt16(o, true) : kind === "i8" ? (o) => view.getInt8(o) : kind === "f32" ? (o) => view.getFloat32(o, true) : (o) => view.getFloat64(o, true);
    return Array.from({ length: Math.min(count, bytes.length / size) }, (_, i) => read(i * size));
  }

  function unpackedTurn(turn, texts) {
    const p = turn && turn.packed;
    if (!p) return turn;
    const n = p.count, k = p.top_k;
    const vocabIds = littleEndian(p.vocab_ids, "i32", arr(p.vocab).length);
    vocabIds.forEach((id, i) => texts.byId.set(id, p.vocab[i]));
    arr(p.alt_texts).forEach((t) => texts.table.push(t));
    const altLps = littleEndian(p.top_logprobs, p.float, n * k);
    const altIds = p.top_ids ? littleEndian(p.top_ids, "i32", n * k) : altLps.map(() => -1);
    const altText = p.top_texts ? littleEndian(p.top_texts, p.top_texts_width || "i32", n * k) : altLps.map(() => -1);
    const ranks = p.sampled_rank ? littleEndian(p.sampled_rank, "i8", n) : Array(n).fill(-1);
    const ownIdCount = ranks.filter((r, pos) => r < 0 || altIds[pos * k + r] < 0).length;
    const ownIds = littleEndian(p.ids, "i32", ownIdCount);
    const ownLps = littleEndian(p.logprobs, p.float, ranks.filter((r) => r < 0).length);
    let nextId = 0, nextLp = 0;
    const ids = [], lps = [];
    ranks.forEach((r, pos) => {
      const slot = pos * k + r;
      ids.push(r >= 0 && altIds[slot] >= 0 ? altIds[slot] : ownIds[nextId++]);
      lps.push(r >= 0 ? altLps[slot] : ownLps[nextLp++]);
    });
    const alternative = (slot) => altIds[slot] >= 0 ? [texts.byId.get(altIds[slot]), altLps[slot], altIds[slot]] : [texts.table[altText[slot]], altLps[slot], null];
    return Object.assign({}, turn, {
      packed: null,
      completion_token_ids: ids,
      completion_tokens: ids.map((id) => texts.byId.get(id)),
      per_token_logps: lps,
      top_logprobs: k ? ids.map((_, pos) => Array.from({ length: k }, (_, j) => alternative(pos * k + j))) : [],
    });
  }

  function unpackedTurns(turns) {
    const texts = { byId: new Map(), table: [] };
    return turns.map((turn) => unpackedTurn(turn, texts));
  }

  function statusClass(status) {
    if (status === "completed") return "ok";
    if (["setup_failed", "agent_error", "agent_timeout"].includes(status)) return "warn";
    return "bad";
  }

  /* Probability 1 is green, 0 is red: the hue follows exp(logprob). */
  function tokenColour(logprob) {
    const p = isNum(logprob) ? Math.exp(Math.min(0, logprob)) : 0;
    return "hsl(" + Math.round(120 * p) + ", 75%, " + (p > 0.95 ? 90 : 78) + "%)";
  }

  function field(label, value, cls) {
    return el("div", { class: "field" }, el("div", { class: "label", text: label }), el("div", { class: "value " + (cls || "") }, value));
  }

  function block(title, open, fill, id) {
    const details = el("details", { open: open });
    const body = el("div");
    let filled = false;
    const fillOnce = () => { if (!filled) { filled = true; fill(body); } };
    details.append(el("summary", {}, el("h2", { text: title })), body);
    details.addEventListener("toggle", () => { if (details.open) fillOnce(); });
    if (open) fillOnce();
    return el("section", { class: "block", id: id }, details);
  }

  function summary(result) {
    const usage = obj(result.usage);
    const upstream = obj(result.upstream);
    const status = String(result.status || "unknown");
    const reward = isNum(result.reward) ? (Number.isInteger(result.reward) ? result.reward.toFixed(1) : String(result.reward)) : "none";
    const grid = el("div", { class: "summary-grid" },
      field("status", el("span", { class: "badge " + statusClass(status), id: "status", text: status })),
      field("reward", el("span", { class: "reward-value", id: "reward", text: reward })),
      field("reward source", String(result.reward_source || "none")),
      field("failed phase", String(result.failed_phase || "–")),
      field("turns", el("span", { id: "turn-count", text: String(arr(result.proxy_turns).length) })),
      field("tokens", (usage.prompt_tokens || 0) + " prompt + " + (usage.completion_tokens || 0) + " completion (" + (usage.llm_calls || 0) + " calls, from " + (usage.source || "none") + ")"),
      field("mode", String(result.mode || "") + (result.oracle ? " · oracle run" : "")),
      field("backend", String(result.backend || "–") + " " + String(result.sandbox_id || "")),
      field("OpenCode", String(result.opencode_version || "–")),
      field("model", [upstream.endpoint, upstream.model].filter(Boolean).join(" · ") || "–"),
      field("agent exit code", result.agent_exit_code === null || result.agent_exit_code === undefined ? "–" : String(result.agent_exit_code)),
      field("wall time", secs(result.wall_s)),
      field("limits hit", arr(result.limits_hit).join(", ") || "none"),
      field("isolation", Object.entries(obj(result.enforcement)).map(([k, v]) => k + ": " + v).join(" · ") || "–"),
      field("provenance", provenanceText(obj(result.provenance))),
      field("graded in", text(result.grade_isolation || "–")),
    );
    const parts = [grid];
    if (result.error) parts.push(el("p", { class: "error-text", id: "error", text: String(result.error) }));
    const tests = arr(result.test_outcomes);
    if (tests.length) parts.push(el("ul", { class: "test-outcomes", id: "test-outcomes" }, tests.map((t) => el("li", { text: text(obj(t).outcome) + " · " + text(obj(t).test_id) + " (" + text(obj(t).expected) + ")" }))));
    const findings = arr(result.integrity);
    if (findings.length) parts.push(el("ul", { class: "warnings", id: "integrity" }, findings.map((f) => el("li", { text: obj(f).kind === "report_forged" ? "test report forged in pytest's process: " + text(obj(f).path) + " (graded 0)" : "work dir entry " + text(obj(f).path) + ": " + text(obj(f).kind) + " " + text(obj(f).act) + " by the agent, " + text(obj(f).response) + " before verify" }))));
    const warnings = arr(result.warnings);
    if (warnings.length) parts.push(el("ul", { class: "warnings", id: "warnings" }, warnings.map((w) => el("li", { text: "warning: " + text(w) }))));
    return parts;
  }

  function phaseBar(result) {
    const timings = obj(result.timings);
    const spans = PHASES.map((name, i) => [name, timings[name + "_s"], PHASE_COLOURS[i]]).filter(([, s]) => isNum(s));
    const total = spans.reduce((sum, [, s]) => sum + s, 0);
    const bar = el("div", { class: "phase-bar", id: "phase-bar" });
    const legend = el("div", { class: "legend" });
    for (const [name, s, colour] of spans) {
      const seg = el("div", { class: "seg", title: name + ": " + secs(s), "data-phase": name, text: name });
      seg.style.flex = (total > 0 ? s / total : 1) + " 1 0";
      seg.style.background = colour;
      bar.append(seg);
      const swatch = el("span", { class: "swatch" });
      swatch.style.background = colour;
      legend.append(el("span", {}, swatch, name + " " + secs(s)));
    }
    if (!spans.length) return [el("p", { class: "muted", text: "no phase timings" })];
    return [bar, legend];
  }

  const KIND_COLOURS = { agent: "#1a7f37", sub_agent: "#0969da", auxiliary: "#8250df", unattributed: "#6e7781" };
  const MAX_LANES = 8;

  /* Seconds covered by the union of [start, end] intervals. */
  function covered(spans) {
    let total = 0;
    let reach = -Infinity;
    for (const [start, end] of spans.slice().sort((a, b) => a[0] - b[0])) {
      if (end <= reach) continue;
      total += end - Math.max(start, reach);
      reach = end;
    }
    return total;
  }

  /* Model calls (the proxy's clock) and tool runs (OpenCode's events, agent-written) with unix times. */
  function agentEvents(result, agentS) {
    const calls = [];
    const tools = [];
    let untimed = 0;
    arr(result.proxy_turns).forEach((turn, index) => {
      const t = obj(turn);
      const start = wireFloat(t.timestamp);
      const latency = wireFloat(t.latency_s);
      if (isNum(start) && start > 0) calls.push({ index: index, turn: t, start: start, end: start + (isNum(latency) && latency > 0 ? latency : 0) });
      else untimed++;
    });
    const first = calls.length ? Math.min(...calls.map((c) => c.start)) : null;
    const last = calls.length ? Math.max(...calls.map((c) => c.end)) : null;
    let outside = 0;
    arr(result.tool_calls).forEach((call) => {
      const c = obj(call);
      const start = wireFloat(c.started_at);
      const end = wireFloat(c.ended_at);
      if (!isNum(start) || start <= 0) { untimed++; return; }
      // A tool's times are what the agent's own event stream says: one far from every model call is not drawn.
      if (first !== null && (start < first - agentS || start > last + agentS)) { outside++; return; }
      tools.push({ call: c, start: start, end: isNum(end) && end >= start ? end : null });
    });
    return { calls: calls, tools: tools, untimed: untimed, outside: outside };
  }

  function lanes(events) {
    const ends = [];
    return events.slice().sort((a, b) => a.start - b.start).map((event) => {
      let lane = ends.findIndex((end) => end <= event.start);
      if (lane < 0) lane = ends.length < MAX_LANES ? ends.length : MAX_LANES - 1;
      ends[lane] = Math.max(ends[lane] === undefined ? -Infinity : ends[lane], event.end);
      return [lane, event];
    });
  }

  function tickStep(axis) {
    const raw = axis / 8;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= raw);
  }

  function timelineRow(label, bars, height, cls) {
    const track = el("div", { class: "tl-track" }, bars);
    if (height) track.style.height = height + "px";
    return el("div", { class: "tl-row " + (cls || "") }, el("div", { class: "tl-label", text: label }), track);
  }

  function timelineBar(cls, from, to, axis, label, tip, lane) {
    const bar = el("div", { class: "tl-bar " + cls, title: tip, text: label });
    bar.style.left = (100 * from / axis) + "%";
    bar.style.width = (100 * Math.max(0, to - from) / axis) + "%";
    bar.style.top = (lane || 0) * 20 + 2 + "px";
    return bar;
  }

  function callBar(c, lane, scale) {
    const t = c.turn;
    const number = t.turn === undefined ? c.index : t.turn;
    const tip = "turn " + number + " · " + (t.kind || "agent") + " · +" + secs(scale.at(c.start)) + " · latency " + secs(wireFloat(t.latency_s)) +
      " · TTFT " + secs(wireFloat(t.ttft_s)) + " · " + arr(t.completion_tokens).length + " tokens · " + (t.outcome || "complete");
    const bar = timelineBar("tl-call", scale.at(c.start), scale.at(c.end), scale.axis, "#" + number, tip, lane);
    bar.style.background = KIND_COLOURS[t.kind] || KIND_COLOURS.agent;
    const ttft = wireFloat(t.ttft_s);
    if (isNum(ttft) && c.end > c.start) {
      const wait = el("span", { class: "tl-ttft" });
      wait.style.width = Math.min(100, 100 * ttft / (c.end - c.start)) + "%";
      bar.prepend(wait);
    }
    bar.addEventListener("click", () => { const card = document.getElementById("turn-" + c.index); if (card) card.scrollIntoView({ block: "start" }); });
    return bar;
  }

  function toolBar(tool, lane, scale) {
    const c = tool.call;
    const exit = c.exit_code === null || c.exit_code === undefined ? "" : " · exit " + c.exit_code;
    const tip = text(c.tool) + " · " + text(c.status) + exit + " · +" + secs(scale.at(tool.start)) +
      (tool.open ? " · no end recorded" : " · " + secs(tool.end - tool.start)) + (c.title ? " · " + text(c.title) : "");
    const cls = "tl-tool " + (c.status === "completed" ? "ok" : "bad") + (tool.open ? " open" : "");
    return timelineBar(cls, scale.at(tool.start), scale.at(tool.end), scale.axis, text(c.tool), tip, lane);
  }

  function axisTicks(axis) {
    const step = tickStep(axis);
    const digits = Math.max(0, -Math.floor(Math.log10(step)));
    const ticks = [];
    for (let x = 0; x <= axis + 1e-9; x += step) {
      const tick = el("span", { class: "tl-tick", text: "+" + x.toFixed(digits) + " s" });
      tick.style.left = (100 * x / axis) + "%";
      ticks.push(tick);
    }
    // A tick near the right edge is written to its left so it stays inside the track.
    if (ticks.length > 1 && (ticks.length - 1) * step > 0.9 * axis) ticks[ticks.length - 1].classList.add("last");
    return ticks;
  }

  /* Where the agent phase's seconds went: start-up, model calls, tool runs, and neither. */
  function timelineLegend(agentS, startup, calls, tools, axis) {
    const callSpans = calls.map((c) => [c.start, c.end]);
    const toolSpans = tools.map((t) => [t.start, t.end]);
    const neither = Math.max(0, axis - startup - covered([...callSpans, ...toolSpans]));
    const kinds = Object.entries(KIND_COLOURS).filter(([kind]) => calls.some((c) => (c.turn.kind || "agent") === kind));
    return el("div", { class: "legend", id: "timeline-legend" },
      el("span", { text: "agent phase " + secs(agentS) + ": start-up " + secs(startup) + " · model calls busy " + secs(covered(callSpans)) +
        " · tools busy " + secs(covered(toolSpans)) + " · neither " + secs(neither) }),
      kinds.map(([kind, colour]) => {
        const swatch = el("span", { class: "swatch" });
        swatch.style.background = colour;
        return el("span", {}, swatch, kind + " call");
      }),
      el("span", { text: "darker head of a call: time to first token; click a call to open its turn" }));
  }

  function noTimeline(reason) {
    return [el("p", { class: "muted", id: "timeline-none", text: "no agent timeline: " + reason })];
  }

  function timelineView(result) {
    const agentS = wireFloat(obj(result.timings).agent_s);
    if (result.oracle) return noTimeline("an oracle run (solution commands ran in place of the agent)");
    if (!isNum(agentS)) return noTimeline("the agent phase did not run");
    const { calls, tools: timedTools, untimed, outside } = agentEvents(result, agentS);
    if (!calls.length && !timedTools.length) return noTimeline("no model call or tool run carries a start time (results before schema version 3 record none)");
    const events = [...calls, ...timedTools];
    const first = Math.min(...events.map((e) => e.start));
    const last = Math.max(...events.map((e) => (e.end === null ? e.start : e.end)));
    // The result holds no clock time for the phase's start: the agent time the events do not span is put before
    // the first call, where OpenCode starts up (its exit after the last event is usually short).
    const origin = first - Math.max(0, agentS - (last - first));
    const axis = Math.max(agentS, last - origin, 1e-6);
    const scale = { axis: axis, at: (x) => x - origin };
    const tools = timedTools.map((t) => ({ ...t, end: t.end === null ? origin + axis : t.end, open: t.end === null }));
    const startup = (calls.length ? Math.min(...calls.map((c) => c.start)) : first) - origin;
    const callBars = lanes(calls).map(([lane, c]) => [lane, callBar(c, lane, scale)]);
    const toolBars = lanes(tools).map(([lane, t]) => [lane, toolBar(t, lane, scale)]);
    const height = (placed) => 20 * (Math.max(-1, ...placed.map(([lane]) => lane)) + 1) + 4;
    // Without a recorded call (black_box mode) the first thing seen is a tool run, after at least one model call.
    const startupLabel = calls.length ? "OpenCode start-up " : "before the first tool run ";
    const startupBar = timelineBar("tl-startup", 0, startup, axis, startupLabel + secs(startup),
      "before the first model call: OpenCode starting up (and, as the result cannot tell them apart, its exit after the last event)");
    startupBar.id = "tl-startup";
    const notes = [];
    if (untimed) notes.push(untimed + " call(s) or tool run(s) without a start time are not drawn");
    if (outside) notes.push(outside + " tool run(s) whose times lie far outside the model calls are not drawn (OpenCode's events are agent-written)");
    return [
      el("div", { class: "timeline", id: "timeline" },
        timelineRow("agent phase", [timelineBar("tl-phase", 0, agentS, axis, "agent " + secs(agentS), "the agent phase: " + secs(agentS) + " (timings.agent_s)")]),
        timelineRow("start-up", startup > 0 ? [startupBar] : []),
        timelineRow("model calls (" + calls.length + ")", callBars.map(([, bar]) => bar), height(callBars)),
        timelineRow("tool runs (" + tools.length + ")", toolBars.map(([, bar]) => bar), height(toolBars)),
        timelineRow("", axisTicks(axis), 0, "tl-axis")),
      timelineLegend(agentS, startup, calls, tools, axis),
      notes.length ? el("p", { class: "muted", text: notes.join("; ") }) : null,
    ].filter(Boolean);
  }

  function messageContent(message) {
    const content = message.content;
    if (Array.isArray(content)) return content.map((part) => text(obj(part).text !== undefined ? part.text : part)).join("\n");
    return text(content);
  }

  function messageView(message, index) {
    const m = obj(message);
    const role = String(m.role || "?");
    const body = messageContent(m);
    const calls = arr(m.tool_calls).map((call) => {
      const fn = obj(obj(call).function);
      return (fn.name || obj(call).name || "?") + "(" + text(fn.arguments !== undefined ? fn.arguments : obj(call).arguments) + ")";
    });
    const preview = (body || calls.join(" ")).replace(/\s+/g, " ").slice(0, MESSAGE_PREVIEW);
    const details = el("details", { class: "message role-" + role.replace(/[^a-z_]/g, ""), open: role !== "system" && body.length < 2000 });
    details.append(el("summary", {}, el("b", { text: role }), " · " + body.length + " chars" + (m.tool_call_id ? " · " + m.tool_call_id : "") + " · " + preview));
    let filled = false;
    const fill = () => {
      if (filled) return;
      filled = true;
      if (body) details.append(el("pre", { text: body }));
      for (const call of calls) details.append(el("pre", { text: "→ " + call }));
    };
    details.addEventListener("toggle", () => { if (details.open) fill(); });
    if (details.open) fill();
    return details;
  }

  function tokenSpans(turn, turnIndex, from, to) {
    const tokens = arr(turn.completion_tokens);
    const logps = arr(turn.per_token_logps);
    const frag = document.createDocumentFragment();
    for (let i = from; i < to; i++) {
      const span = el("span", { class: "tok", "data-turn": turnIndex, "data-pos": i, text: text(tokens[i]) });
      span.style.backgroundColor = tokenColour(logps[i]);
      frag.append(span);
    }
    return frag;
  }

  function tokensView(turn, turnIndex) {
    const count = arr(turn.completion_tokens).length;
    const box = el("div", { class: "tokens" });
    let shown = Math.min(count, TOKENS_PER_CHUNK);
    box.append(tokenSpans(turn, turnIndex, 0, shown));
    const wrap = el("div", {}, box);
    if (shown < count) {
      const more = el("button", { class: "more" });
      const label = () => { more.textContent = "show " + Math.min(TOKENS_PER_CHUNK, count - shown) + " more of " + count + " tokens"; };
      label();
      more.addEventListener("click", () => {
        const next = Math.min(count, shown + TOKENS_PER_CHUNK);
        box.append(tokenSpans(turn, turnIndex, shown, next));
        shown = next;
        if (shown >= count) more.remove(); else label();
      });
      wrap.append(more);
    }
    return wrap;
  }

  function turnBody(turn, turnIndex) {
    const request = obj(turn.request);
    const response = obj(turn.response);
    const base = obj(request.messages_base);
    const parts = [];
    if (turn.upstream_error) parts.push(el("p", { class: "error-text", text: "upstream error: " + text(turn.upstream_error) }));
    const messages = arr(request.messages);
    const baseNote = base.count !== undefined ? " (after the first " + base.count + " messages of turn " + base.turn + ")" : "";
    parts.push(el("div", { class: "muted", text: messages.length + " message(s) added" + baseNote }));
    messages.forEach((m, i) => parts.push(messageView(m, i)));
    if (arr(turn.completion_tokens).length) {
      parts.push(el("div", { class: "muted", text: "completion tokens (hover or click a token)" }), tokensView(turn, turnIndex));
    } else if (response.content || response.reasoning) {
      parts.push(el("div", { class: "muted", text: "response (no token record)" }), el("pre", { text: text(response.reasoning || "") + text(response.content || "") }));
    }
    for (const call of arr(response.tool_calls)) {
      const c = obj(call);
      parts.push(el("pre", { text: "tool call → " + text(c.name) + "(" + text(c.arguments) + ")" }));
    }
    return parts;
  }

  function turnHead(turn, index) {
    const logps = arr(turn.per_token_logps).map(wireFloat).filter(isNum);
    const mean = logps.length ? logps.reduce((a, b) => a + b, 0) / logps.length : null;
    const outcome = String(turn.outcome || "complete");
    return el("div", { class: "turn-head" },
      el("span", { class: "turn-index", text: "#" + index }),
      el("span", { class: "badge", text: String(turn.kind || "agent") }),
      turn.template_changed ? el("span", { class: "badge", text: "template changed" }) : null,
      el("span", { class: "badge " + (outcome === "complete" ? "ok" : "bad"), text: outcome }),
      el("span", { text: "finish: " + (turn.finish_reason || "–") }),
      el("span", { text: arr(turn.completion_tokens).length + " tokens" }),
      el("span", { text: "latency " + secs(turn.latency_s) }),
      el("span", { text: "TTFT " + secs(turn.ttft_s) }),
      mean === null ? null : el("span", { text: "mean logprob " + mean.toFixed(3) }),
      turn.upstream_status ? el("span", { class: "muted", text: "HTTP " + turn.upstream_status }) : null,
    );
  }

  /* Turn bodies are built only when their card nears the viewport, so a 1,000-turn result opens at once. */
  function turnsView(turns) {
    const list = el("div", { id: "turns" });
    const pending = new Map();
    const render = (card) => {
      const index = pending.get(card);
      if (index === undefined) return;
      pending.delete(card);
      const body = card.querySelector(".turn-body");
      body.textContent = "";
      body.append(...turnBody(obj(turns[index]), index));
      card.dataset.rendered = "1";
    };
    const observer = "IntersectionObserver" in window
      ? new IntersectionObserver((entries) => {
        for (const entry of entries) if (entry.isIntersecting) { observer.unobserve(entry.target); render(entry.target); }
      }, { rootMargin: "600px 0px" })
      : null;
    turns.forEach((turn, index) => {
      const card = el("div", { class: "turn", "data-index": index, id: "turn-" + index },
        turnHead(obj(turn), index), el("div", { class: "turn-body" }, el("span", { class: "pending", text: "…" })));
      pending.set(card, index);
      list.append(card);
      if (observer) observer.observe(card); else render(card);
    });
    const legend = el("div", { class: "legend" }, "token probability: 0",
      (() => { const g = el("span", { class: "gradient" }); g.style.background = "linear-gradient(90deg," + [0, 0.25, 0.5, 0.75, 1].map((p) => tokenColour(Math.log(Math.max(p, 1e-9)))).join(",") + ")"; return g; })(), "1");
    return [legend, turns.length ? list : el("p", { class: "muted", text: "no turns were captured (black_box mode, an oracle run, or the agent never called the model)" })];
  }

  const isId = (x) => Number.isInteger(x);
  /* Descending by logprob; NaN (and anything not a number) last. */
  const byLogprob = (a, b) => {
    const x = isNum(a.logprob) || a.logprob === -Infinity ? a.logprob : -Infinity;
    const y = isNum(b.logprob) || b.logprob === -Infinity ? b.logprob : -Infinity;
    return x > y ? -1 : x < y ? 1 : 0;
  };

  /* The recorded alternatives at one position, most probable first, the sampled token marked (and added when the
     server did not list it); an id the server did not give is "?", except the sampled token's, which is known. */
  function alternatives(turn, pos) {
    const id = arr(turn.completion_token_ids)[pos];
    const token = arr(turn.completion_tokens)[pos];
    const alts = arr(arr(turn.top_logprobs)[pos]).map((alt) => {
      const [t, rawL, tid] = arr(alt);
      return { token: t, logprob: wireFloat(rawL), id: isId(tid) ? tid : null, sampled: false, listed: true };
    });
    if (!alts.length) return alts;
    let k = alts.findIndex((a) => (isId(id) && a.id !== null ? a.id === id : a.token === token));
    if (k < 0) {
      alts.push({ token: token, logprob: wireFloat(arr(turn.per_token_logps)[pos]), id: null, sampled: false, listed: false });
      k = alts.length - 1;
    }
    alts[k].sampled = true;
    if (alts[k].id === null && isId(id)) alts[k].id = id;
    return alts.sort(byLogprob);
  }

  function alternativesTable(alts) {
    const rows = alts.map((a) => el("tr", { class: a.sampled ? "chosen" : null },
      el("td", { class: "mark", text: a.sampled ? "▶" : "" }),
      el("td", { text: JSON.stringify(text(a.token)) + (a.listed ? "" : " (not in top-k)") }),
      el("td", { text: isNum(a.logprob) ? a.logprob.toFixed(4) : String(a.logprob) }),
      el("td", { text: isNum(a.logprob) ? (100 * Math.exp(a.logprob)).toFixed(1) + "%" : "–" }),
      el("td", { text: a.id === null ? "?" : String(a.id), title: a.id === null ? "the model server gave no id for this alternative" : null })));
    return el("table", { class: "topk" },
      el("tr", {}, el("th", { text: "" }), el("th", { text: "top-k" }), el("th", { text: "logprob" }), el("th", { text: "p" }), el("th", { text: "id" })), rows);
  }

  function popupFor(root, result) {
    const popup = el("div", { id: "tok-popup", role: "dialog" });
    document.body.append(popup);
    let pinned = null;
    const show = (span, anchor) => {
      const turn = obj(arr(result.proxy_turns)[Number(span.dataset.turn)]);
      const pos = Number(span.dataset.pos);
      const lp = wireFloat(arr(turn.per_token_logps)[pos]);
      const id = arr(turn.completion_token_ids)[pos];
      const token = arr(turn.completion_tokens)[pos];
      const alts = alternatives(turn, pos);
      popup.textContent = "";
      popup.append(
        el("div", {}, el("b", { text: "token " }), el("code", { class: "popup-token", text: JSON.stringify(text(token)) })),
        el("div", { class: "popup-id", text: "id: " + (id === undefined ? "–" : String(id)) }),
        el("div", { class: "popup-logprob", text: "logprob: " + (isNum(lp) ? lp.toFixed(4) + " (p = " + (100 * Math.exp(lp)).toFixed(2) + "%)" : "–") }),
        alts.length ? alternativesTable(alts) : el("div", { class: "muted", text: "no top-k alternatives recorded" }),
      );
      popup.style.display = "block";
      const rect = anchor.getBoundingClientRect();
      const top = rect.bottom + 6 + popup.offsetHeight > window.innerHeight ? rect.top - popup.offsetHeight - 6 : rect.bottom + 6;
      popup.style.top = Math.max(4, top) + "px";
      popup.style.left = Math.max(4, Math.min(rect.left, window.innerWidth - popup.offsetWidth - 8)) + "px";
    };
    const hide = () => { popup.style.display = "none"; };
    root.addEventListener("mouseover", (event) => {
      const span = event.target.closest && event.target.closest(".tok");
      if (span && !pinned) show(span, span);
    });
    root.addEventListener("mouseout", (event) => {
      const span = event.target.closest && event.target.closest(".tok");
      if (span && !pinned) hide();
    });
    root.addEventListener("click", (event) => {
      const span = event.target.closest && event.target.closest(".tok");
      if (pinned) pinned.classList.remove("pinned");
      if (!span || span === pinned) { pinned = null; hide(); return; }
      pinned = span;
      span.classList.add("pinned");
      show(span, span);
    });
    closePopup = () => { if (pinned) pinned.classList.remove("pinned"); pinned = null; hide(); };
    return popup;
  }

  const TASK_SHOWN = new Set([
    "instruction", "task_id", "image", "template", "workdir", "mode", "network", "endpoint", "base_url", "model",
    "disable_thinking", "token_in", "top_logprobs", "max_tokens_cap", "sampling", "setup", "setup_as", "verify",
    "verify_as", "verify_sandbox", "solution", "env", "files", "verify_files", "agent_timeout_s", "setup_timeout_s",
    "verify_timeout_s", "total_timeout_s", "upstream_idle_timeout_s", "upstream_max_unreachable",
    "upstream_max_server_errors", "memory_mb", "max_processes", "disk_mb", "cpus", "api_key", "result_text",
  ]);

  function settings(rows) {
    const shown = rows.filter(([, value]) => value !== undefined && value !== null && value !== "");
    return el("table", { class: "grid kv" }, shown.map(([label, value]) => el("tr", {}, el("th", { text: label }), el("td", { class: "mono", title: String(value), text: String(value) }))));
  }

  function commandList(title, commands, note) {
    if (!commands.length) return el("div", { class: "muted", text: title + ": none" });
    return el("div", {}, el("div", { class: "muted", text: title + " (" + note + ")" }), el("ol", { class: "commands" }, commands.map((c) => el("li", {}, el("code", { text: text(c) })))));
  }

  function taskFiles(title, files) {
    const names = Object.keys(files);
    if (!names.length) return null;
    return el("div", {}, el("div", { class: "muted", text: title + " (" + names.length + ")" }), filesView(files, [], []));
  }

  /* The request the rollout ran (RolloutResult.task), without its key. */
  function taskView(task) {
    const t = obj(task);
    const timeout = (x) => (isNum(x) ? secs(x) : null);
    const sampling = Object.entries(obj(t.sampling)).filter(([, v]) => v !== null && v !== undefined);
    const env = Object.keys(obj(t.env));
    const rest = Object.entries(t).filter(([key]) => !TASK_SHOWN.has(key));
    return [
      el("div", { class: "muted", text: "instruction" }),
      el("pre", { class: "task-instruction", text: text(t.instruction) }),
      el("div", { class: "task-columns" },
        el("div", {}, el("h3", { text: "Where" }), settings([
          ["image", t.image || (t.template ? null : "(the backend's default)")], ["template", t.template],
          ["work dir", t.workdir || "/home/user/workdir"], ["mode", t.mode], ["network", t.network],
          ["env", env.length ? env.join(", ") + " (values in the result JSON)" : null],
        ])),
        el("div", {}, el("h3", { text: "Model and sampling" }), settings([
          ["endpoint", t.endpoint], ["model", t.model], ["base URL", t.base_url],
          ["disable thinking", t.disable_thinking === null || t.disable_thinking === undefined ? "endpoint's default" : t.disable_thinking],
          ["token in", t.token_in], ["top logprobs", t.top_logprobs], ["max tokens cap", t.max_tokens_cap],
          ["sampling", sampling.length ? sampling.map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v))).join(" · ") : "the model server's defaults"],
        ])),
        el("div", {}, el("h3", { text: "Limits" }), settings([
          ["agent timeout", timeout(t.agent_timeout_s)], ["setup timeout (each)", timeout(t.setup_timeout_s)],
          ["verify timeout (each)", timeout(t.verify_timeout_s)], ["total timeout", isNum(t.total_timeout_s) ? secs(t.total_timeout_s) : "derived from the phases"],
          ["model idle timeout", timeout(t.upstream_idle_timeout_s)],
          ["stop after", isNum(t.upstream_max_unreachable) ? t.upstream_max_unreachable + " unreachable / " + t.upstream_max_server_errors + " 5xx calls in a row" : null],
          ["memory", isNum(t.memory_mb) ? t.memory_mb + " MiB" : null], ["processes", t.max_processes],
          ["disk", isNum(t.disk_mb) ? t.disk_mb + " MiB" : null], ["CPUs", t.cpus],
        ])),
      ),
      commandList("setup commands", arr(t.setup), "as " + text(t.setup_as || "root") + ", in order; the first failure stops the rollout"),
      commandList("verify commands", arr(t.verify), "as " + text(t.verify_as || "grader") + ", " + text(t.verify_sandbox || "same") + " sandbox"),
      Array.isArray(t.solution) ? commandList("solution commands", t.solution, "oracle run, in place of the agent") : null,
      taskFiles("files written before setup", obj(t.files)),
      taskFiles("protected files written before verify", obj(t.verify_files)),
      rest.length ? settings(rest.map(([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)])) : null,
    ].filter(Boolean);
  }

  // A verify command's exit code is not the grade (a Harbor test.sh exits 0 after writing reward 0), so its badge
  // is neutral, never a green that reads as "passed"; the reward says how the attempt did.
  function commandsView(results, graded) {
    if (!results.length) return [el("p", { class: "muted", text: "none" })];
    return results.map((r, i) => {
      const c = obj(r);
      const exit = c.exit_code === null || c.exit_code === undefined ? (c.timed_out ? "timed out" : "killed") : "exit " + c.exit_code;
      const tone = graded ? "neutral" : c.exit_code === 0 ? "ok" : "bad";
      const badge = el("span", { class: "badge " + tone, text: exit, title: graded ? "the command's exit code, not the grade: see the reward" : null });
      const details = el("details", { class: "command" },
        el("summary", {}, badge, " " + secs(c.duration_s) + " · ", el("code", { text: text(c.cmd) })));
      details.append(el("div", { class: "muted", text: "stdout" + (c.output_truncated ? " (truncated)" : "") }), el("pre", { text: text(c.stdout) || " " }),
        el("div", { class: "muted", text: "stderr" }), el("pre", { text: text(c.stderr) || " " }));
      if (i === results.length - 1 && c.exit_code !== 0) details.open = true;
      return details;
    });
  }

  function toolCallsView(calls) {
    if (!calls.length) return [el("p", { class: "muted", text: "none" })];
    return [el("table", { class: "grid", id: "tool-calls" },
      el("tr", {}, el("th", { text: "tool" }), el("th", { text: "status" }), el("th", { text: "exit" }), el("th", { text: "title" })),
      calls.map((call) => {
        const c = obj(call);
        return el("tr", {}, el("td", { text: text(c.tool) }), el("td", {}, el("span", { class: "badge " + (c.status === "completed" ? "ok" : "bad"), text: text(c.status) })),
          el("td", { text: c.exit_code === null || c.exit_code === undefined ? "" : String(c.exit_code) }), el("td", { class: "mono", text: text(c.title) }));
      }))];
  }

  function filesView(files, extra, nonUtf8) {
    const names = Object.keys(files);
    const parts = names.map((name) => {
      const details = el("details", {}, el("summary", {}, el("code", { text: name }), " · " + text(files[name]).length + " chars"));
      details.addEventListener("toggle", () => { if (details.open && details.childNodes.length === 1) details.append(el("pre", { text: text(files[name]) })); });
      return details;
    });
    if (extra.length) parts.push(el("p", { class: "muted", text: "also present, not collected: " + extra.map(text).join(", ") }));
    if (nonUtf8.length) parts.push(el("p", { class: "muted", text: "names that are not UTF-8 (bad bytes as \\xNN): " + nonUtf8.map((n) => text(obj(n).display)).join(", ") }));
    return parts.length ? parts : [el("p", { class: "muted", text: "none" })];
  }

  /* "0–3, 5, 7" for [0, 1, 2, 3, 5, 7]. */
  function turnRanges(turns) {
    const out = [];
    for (const t of turns) {
      const lastRange = out[out.length - 1];
      if (lastRange && t === lastRange[1] + 1) lastRange[1] = t; else out.push([t, t]);
    }
    return out.map(([a, b]) => (a === b ? String(a) : a + "–" + b)).join(", ");
  }

  const count = (n) => (isNum(n) ? n.toLocaleString("en-US") : "–");
  const share = (part, whole) => (isNum(part) && isNum(whole) && whole > 0 ? (Math.floor(1000 * part / whole) / 10).toFixed(1) + "%" : "–");

  /* One sequence drawn on a scale shared by all: its prompt, then per turn the environment's and the model's tokens;
     a tick where a later turn's prompt left it (a fork). */
  function sequenceShape(view, scale, forks) {
    const total = view.prompt_tokens + view.model_tokens + view.environment_tokens;
    const bar = el("div", { class: "seq-shape" });
    bar.style.width = Math.max(1, 100 * total / scale) + "%";
    const piece = (cls, n, tip) => {
      if (!n) return;
      const seg = el("span", { class: cls, title: tip });
      seg.style.flex = n + " 0 0";
      bar.append(seg);
    };
    piece("prompt", view.prompt_tokens, "prompt: " + count(view.prompt_tokens) + " tokens");
    for (const seg of arr(view.segments)) {
      const s = obj(seg);
      const which = s.turn === null || s.turn === undefined ? "" : " before turn " + s.turn;
      piece("env", s.environment_tokens, "environment" + which + ": " + count(s.environment_tokens) + " tokens (mask 0)");
      piece("model", s.model_tokens, (s.turn === null || s.turn === undefined ? "model" : "turn " + s.turn) + ": " + count(s.model_tokens) + " tokens (mask 1)");
    }
    for (const fork of forks) {
      const mark = el("span", { class: "fork-mark", title: "turn " + fork.turn + "'s prompt leaves this sequence at position " + fork.position + " (" + fork.cause + ")" });
      mark.style.left = (total ? 100 * Math.min(fork.position, total) / total : 0) + "%";
      bar.append(mark);
    }
    return bar;
  }

  function coverageView(coverage) {
    const c = obj(coverage);
    const parts = "agent_tokens" in c ? [["", c]] : Object.entries(c).filter(([, v]) => v && typeof v === "object");
    if (!parts.length) return null;
    return el("div", {}, el("h3", { text: "Coverage: the rollout's agent tokens each export carries" }),
      el("table", { class: "grid", id: "coverage" },
        el("tr", {}, el("th", { text: "export" }), el("th", { text: "carries" }), el("th", { text: "turns" }), el("th", { text: "left out" })),
        parts.map(([name, value]) => {
          const v = obj(value);
          const left = Object.entries(obj(v.left_out)).map(([turn, why]) => "turn " + turn + ": " + text(why)).join("; ");
          return el("tr", {}, el("td", { text: text(v.export || name).replace(/_/g, " ") }),
            el("td", { text: count(v.covered_tokens) + " of " + count(v.agent_tokens) + " agent tokens (" + share(v.covered_tokens, v.agent_tokens) + ")" }),
            el("td", { text: count(v.covered_turns) + " of " + count(v.turns) }), el("td", { class: "muted", text: left || "none" }));
        })));
  }

  function forksView(forks, views) {
    if (!forks.length) return null;
    return el("div", {}, el("h3", { text: "Forks (" + forks.length + ")" }),
      el("table", { class: "grid", id: "fork-list" },
        el("tr", {}, el("th", { text: "turn" }), el("th", { text: "left sequence" }), el("th", { text: "at position" }), el("th", { text: "id there: sequence / prompt" }), el("th", { text: "cause" }), el("th", { text: "new sequence" })),
        forks.map((fork) => {
          const f = obj(fork);
          const started = views.findIndex((v) => obj(obj(v).sequence).started === "drift" && arr(obj(obj(v).sequence).turns)[0] === f.turn);
          const idText = (x) => (x === null || x === undefined ? "(end)" : String(x));
          return el("tr", {}, el("td", { text: String(f.turn) }), el("td", { text: String(f.sequence) }), el("td", { text: count(f.position) }),
            el("td", { class: "mono", text: idText(f.sequence_id) + " / " + idText(f.prompt_id) }), el("td", {}, el("span", { class: "badge warn", text: text(f.cause) })),
            el("td", { text: started < 0 ? "–" : String(started) }));
        })));
  }

  function sequenceRows(views, forks) {
    const scale = Math.max(1, ...views.map((v) => v.prompt_tokens + v.model_tokens + v.environment_tokens));
    return el("table", { class: "grid", id: "sequence-list" },
      el("tr", {}, el("th", { text: "#" }), el("th", { text: "started" }), el("th", { text: "turns" }), el("th", { text: "prompt" }), el("th", { text: "model" }),
        el("th", { text: "environment" }), el("th", { text: "mean logprob" }), el("th", { class: "shape-col", text: "shape" })),
      views.map((view, i) => {
        const s = obj(view.sequence);
        const lp = wireFloat(view.mean_logprob);
        const notes = [view.trl_row ? "the TRL row" : null, s.kind === "sub_agent" ? "sub-agent " + text(s.session_id) : null, s.usable === false ? "unusable: " + text(s.unusable_reason) : null].filter(Boolean);
        return el("tr", { class: "sequence-row" + (s.usable === false ? " unusable" : ""), "data-index": i },
          el("td", { text: String(i) }),
          el("td", {}, el("span", { class: "badge " + (s.started === "first" ? "ok" : "warn"), text: text(s.started) })),
          el("td", { text: turnRanges(arr(s.turns)) }),
          el("td", { text: count(view.prompt_tokens) }), el("td", { text: count(view.model_tokens) }), el("td", { text: count(view.environment_tokens) }),
          el("td", { text: isNum(lp) ? lp.toFixed(3) : lp === null || lp === undefined ? "–" : String(lp) }),
          el("td", {}, sequenceShape(view, scale, forks.filter((f) => f.sequence === i)), notes.length ? el("div", { class: "muted", text: notes.join(" · ") }) : null));
      }));
  }

  /* The training data as opencode_env.training.sequences computed it when the page was written (not here). */
  function trainingView(training) {
    if (!training) return [el("p", { class: "muted", id: "training-none", text: "not computed for this view: the page `opencode-env view RESULT.json` writes shows them" })];
    const t = obj(training);
    if (t.unavailable) return [el("p", { class: "error-text", id: "training-none", text: "could not be computed: " + text(t.unavailable) })];
    const summary = obj(t.summary);
    const views = arr(t.sequences).map(obj);
    const forks = arr(summary.forks).map(obj);
    const skipped = arr(summary.skipped).map(obj);
    const unattributed = arr(summary.unattributed);
    const usage = Object.entries(obj(summary.usage_by_kind)).map(([kind, u]) => kind + " " + obj(u).calls + " calls, " + count(obj(u).prompt_tokens) + " prompt + " + count(obj(u).completion_tokens) + " completion tokens");
    const subAgents = summary.sub_agent_sequences ? " (" + summary.sub_agent_sequences + " of sub-agents)" : "";
    return [
      el("p", { id: "training-line", text: views.length + " sequence(s)" + subAgents + " · " + forks.length + " fork(s) · " + (summary.usable ? "usable" : "not usable") +
        " · aligned: " + (summary.all_aligned ? "yes" : "no (turns " + arr(summary.misaligned_turns).join(", ") + ")") }),
      summary.no_sequences_reason ? el("p", { class: "muted", id: "no-sequences", text: "no sequences: " + text(summary.no_sequences_reason) }) : null,
      views.length ? sequenceRows(views, forks) : null,
      views.length ? el("div", { class: "legend" }, ["prompt", "env", "model"].map((cls) => el("span", {}, el("span", { class: "swatch seq-" + cls }), { prompt: "prompt", env: "environment tokens (mask 0)", model: "model tokens (mask 1)" }[cls])),
        el("span", {}, el("span", { class: "swatch seq-fork" }), "a later turn's prompt leaves the sequence here")) : null,
      forksView(forks, views),
      skipped.length ? el("div", { id: "skipped" }, el("h3", { text: "Skipped turns (" + skipped.length + ")" }), el("ul", {}, skipped.map((x) => el("li", { text: "turn " + x.turn + ": " + text(x.reason) })))) : null,
      unattributed.length ? el("p", { id: "unattributed", text: "unattributed turns " + turnRanges(unattributed) + ": not tied to OpenCode's session, never trained" }) : null,
      coverageView(summary.coverage),
      usage.length ? el("p", { class: "muted", text: "calls by kind: " + usage.join("; ") }) : null,
    ].filter(Boolean);
  }

  function otherFields(result) {
    const extra = Object.keys(result).filter((key) => !KNOWN.has(key) && result[key] !== null);
    return extra.map((key) => {
      const details = el("details", {}, el("summary", {}, el("code", { text: key })));
      details.addEventListener("toggle", () => { if (details.open && details.childNodes.length === 1) details.append(el("pre", { text: text(result[key]).slice(0, 200000) })); });
      return details;
    });
  }

  /* `training` is the page's second JSON block (page.training_view); a caller without one passes nothing. */
  function render(container, result, training) {
    const r = Object.assign({}, obj(result), { proxy_turns: unpackedTurns(arr(obj(result).proxy_turns)) });
    const turns = arr(r.proxy_turns);
    const root = el("main", { class: "rollout" },
      el("h1", { text: "Rollout " + (r.task_id || "(no task id)") }),
      el("section", { class: "block", id: "summary" }, summary(r)),
      el("section", { class: "block", id: "phases" }, el("h2", { text: "Phases" }), phaseBar(r)),
      block("Agent timeline", true, (b) => b.append(...timelineView(r)), "agent-timeline"),
    );
    root.append(block("Task", true, (b) => b.append(...(r.task ? taskView(r.task) : [el("p", { class: "muted", text: "not recorded (results before schema version 3 carry no task)" })])), "task"));
    if (r.oracle) root.append(block("Solution commands (oracle run, in place of the agent)", true, (b) => b.append(...commandsView(arr(r.solution_results))), "solution"));
    root.append(
      block("Setup commands (" + arr(r.setup_results).length + ")", arr(r.setup_results).some((c) => obj(c).exit_code !== 0), (b) => b.append(...commandsView(arr(r.setup_results))), "setup"),
      block("Turns (" + turns.length + ")", true, (b) => b.append(...turnsView(turns)), "turns-block"),
      block("Tool calls (" + arr(r.tool_calls).length + ")", true, (b) => b.append(...toolCallsView(arr(r.tool_calls))), "tools"),
      block("Verify commands (" + arr(r.verify_results).length + ")", true, (b) => b.append(...commandsView(arr(r.verify_results), true)), "verify"),
      block("Files (" + Object.keys(obj(r.files)).length + ")", false, (b) => b.append(...filesView(obj(r.files), arr(r.files_extra), arr(r.files_non_utf8))), "files"),
    );
    if (r.agent_final_text) root.append(block("Agent's final text", false, (b) => b.append(el("pre", { text: text(r.agent_final_text) })), "final"));
    const sequenceCount = training && !training.unavailable ? " (" + arr(training.sequences).length + ")" : "";
    root.append(block("Training sequences" + sequenceCount, true, (b) => b.append(...trainingView(training)), "sequences"));
    root.append(block("Logs", false, (b) => b.append(el("div", { class: "muted", text: "agent log tail" }), el("pre", { text: text(r.agent_log_tail) || " " }),
      el("div", { class: "muted", text: "proxy log tail" }), el("pre", { text: text(r.proxy_log_tail) || " " })), "logs"));
    const others = otherFields(r);
    if (others.length) root.append(block("Other fields (" + others.length + ")", false, (b) => b.append(...others), "other"));
    container.textContent = "";
    container.append(root);
    const old = document.getElementById("tok-popup");
    if (old) old.remove();
    popupFor(root, r);
    return root;
  }

  window.OpencodeViewer = { render: render, tokenColour: tokenColour, el: el };
  const data = document.getElementById("rollout-data");
  const trainingData = document.getElementById("training-data");
  if (data) render(document.getElementById("app"), JSON.parse(data.textContent), trainingData ? JSON.parse(trainingData.textContent) : null);
})();
