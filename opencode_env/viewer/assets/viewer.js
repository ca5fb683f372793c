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
    "request_tools", "oracle", "solution_results", "training_sequences", "sequences",
    "limits_hit", "enforcement", "schema_version", "files_non_utf8", "task",
  ]);
  const TOKENS_PER_CHUNK = 2000;
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
    );
    const parts = [grid];
    if (result.error) parts.push(el("p", { class: "error-text", id: "error", text: String(result.error) }));
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
      const rows = arr(arr(turn.top_logprobs)[pos]).map((alt) => {
        const [t, rawL, tid] = arr(alt);
        const l = wireFloat(rawL);
        const chosen = (tid !== null && tid !== undefined && tid === id) || t === token;
        return el("tr", { class: chosen ? "chosen" : null },
          el("td", { text: JSON.stringify(text(t)) }), el("td", { text: isNum(l) ? l.toFixed(4) : "–" }),
          el("td", { text: isNum(l) ? (100 * Math.exp(l)).toFixed(1) + "%" : "" }), el("td", { text: tid === null || tid === undefined ? "" : String(tid) }));
      });
      popup.textContent = "";
      popup.append(
        el("div", {}, el("b", { text: "token " }), el("code", { class: "popup-token", text: JSON.stringify(text(token)) })),
        el("div", { class: "popup-id", text: "id: " + (id === undefined ? "–" : String(id)) }),
        el("div", { class: "popup-logprob", text: "logprob: " + (isNum(lp) ? lp.toFixed(4) + " (p = " + (100 * Math.exp(lp)).toFixed(2) + "%)" : "–") }),
        rows.length ? el("table", { class: "topk" }, el("tr", {}, el("th", { text: "top-k" }), el("th", { text: "logprob" }), el("th", { text: "p" }), el("th", { text: "id" })), rows)
          : el("div", { class: "muted", text: "no top-k alternatives recorded" }),
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

  function commandsView(results) {
    if (!results.length) return [el("p", { class: "muted", text: "none" })];
    return results.map((r, i) => {
      const c = obj(r);
      const exit = c.exit_code === null || c.exit_code === undefined ? (c.timed_out ? "timed out" : "killed") : "exit " + c.exit_code;
      const details = el("details", { class: "command" },
        el("summary", {}, el("span", { class: "badge " + (c.exit_code === 0 ? "ok" : "bad"), text: exit }), " " + secs(c.duration_s) + " · ", el("code", { text: text(c.cmd) })));
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

  function sequencesOf(result) {
    if (Array.isArray(result.training_sequences)) return result.training_sequences;
    if (Array.isArray(result.sequences)) return result.sequences;
    const training = obj(result.training);
    return Array.isArray(training.sequences) ? training.sequences : null;
  }

  function sequencesView(sequences) {
    return sequences.map((sequence, i) => {
      const s = obj(sequence);
      const ids = arr(s.completion_ids);
      const mask = arr(s.env_mask);
      const logps = arr(s.logprobs);
      const described = Object.entries(s).filter(([, v]) => !Array.isArray(v) || v.length <= 16).map(([k, v]) => k + ": " + (typeof v === "string" ? v : JSON.stringify(v))).join(" · ");
      const details = el("details", { class: "sequence" }, el("summary", {}, el("b", { text: "sequence " + i }),
        " · " + arr(s.prompt_ids).length + " prompt ids · " + ids.length + " completion ids (" + mask.filter((m) => m === 1).length + " model, " + mask.filter((m) => m === 0).length + " environment)"));
      details.addEventListener("toggle", () => {
        if (!details.open || details.dataset.filled) return;
        details.dataset.filled = "1";
        const strip = el("div", { class: "seq-strip" });
        ids.slice(0, 5000).forEach((id, k) => {
          const span = el("span", { class: mask[k] === 0 ? "env" : "model", title: "id " + id + (mask[k] === 0 ? " (environment)" : " logprob " + logps[k]) });
          if (mask[k] !== 0) span.style.background = tokenColour(logps[k]);
          strip.append(span);
        });
        details.append(el("div", { class: "muted", text: described }), strip);
      });
      return details;
    });
  }

  function otherFields(result) {
    const extra = Object.keys(result).filter((key) => !KNOWN.has(key));
    return extra.map((key) => {
      const details = el("details", {}, el("summary", {}, el("code", { text: key })));
      details.addEventListener("toggle", () => { if (details.open && details.childNodes.length === 1) details.append(el("pre", { text: text(result[key]).slice(0, 200000) })); });
      return details;
    });
  }

  function render(container, result) {
    const r = obj(result);
    const turns = arr(r.proxy_turns);
    const root = el("main", { class: "rollout" },
      el("h1", { text: "Rollout " + (r.task_id || "(no task id)") }),
      el("section", { class: "block", id: "summary" }, summary(r)),
      el("section", { class: "block", id: "phases" }, el("h2", { text: "Phases" }), phaseBar(r)),
    );
    if (r.task) root.append(block("Task", false, (b) => b.append(el("pre", { class: "task-instruction", text: text(obj(r.task).instruction) }),
      el("pre", { text: JSON.stringify(Object.fromEntries(Object.entries(obj(r.task)).filter(([k]) => k !== "instruction" && k !== "files" && k !== "verify_files")), null, 2) })), "task"));
    if (r.oracle) root.append(block("Solution commands (oracle run, in place of the agent)", true, (b) => b.append(...commandsView(arr(r.solution_results))), "solution"));
    root.append(
      block("Setup commands (" + arr(r.setup_results).length + ")", arr(r.setup_results).some((c) => obj(c).exit_code !== 0), (b) => b.append(...commandsView(arr(r.setup_results))), "setup"),
      block("Turns (" + turns.length + ")", true, (b) => b.append(...turnsView(turns)), "turns-block"),
      block("Tool calls (" + arr(r.tool_calls).length + ")", true, (b) => b.append(...toolCallsView(arr(r.tool_calls))), "tools"),
      block("Verify commands (" + arr(r.verify_results).length + ")", true, (b) => b.append(...commandsView(arr(r.verify_results))), "verify"),
      block("Files (" + Object.keys(obj(r.files)).length + ")", false, (b) => b.append(...filesView(obj(r.files), arr(r.files_extra), arr(r.files_non_utf8))), "files"),
    );
    if (r.agent_final_text) root.append(block("Agent's final text", false, (b) => b.append(el("pre", { text: text(r.agent_final_text) })), "final"));
    const sequences = sequencesOf(r);
    if (sequences) root.append(block("Training sequences (" + sequences.length + ")", false, (b) => b.append(...sequencesView(sequences)), "sequences"));
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
  if (data) render(document.getElementById("app"), JSON.parse(data.textContent));
})();
