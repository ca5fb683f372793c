/* The /web page: the token once per tab (sessionStorage), every rollout of the server (whichever transport started
   it) with its phases polled live, a form that starts one more, each result opened in the viewer (viewer.js) or
   downloaded as JSON. Server text only reaches the page as text. */
(function () {
  "use strict";
  const el = window.OpencodeViewer.el;
  const TOKEN_KEY = "opencode-env-token";
  const PHASES = ["sandbox", "install", "prepare", "setup", "proxy", "agent", "verify", "collect"];
  const $ = (id) => document.getElementById(id);
  let pollTimer = null;
  let server = null;
  let serverFetched = 0;

  class Unauthorized extends Error {}

  async function api(path, options) {
    const headers = Object.assign({}, (options || {}).headers);
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.authorization = "Bearer " + token;
    const response = await fetch(path, Object.assign({}, options, { headers: headers, cache: "no-store" }));
    if (response.status === 401) throw new Unauthorized("the token was refused");
    return response;
  }

  function askForToken(message) {
    $("web-main").hidden = true;
    $("token-panel").hidden = false;
    $("token-error").textContent = message || "";
    $("token-input").focus();
  }

  function problem(body) {
    if (body && Array.isArray(body.detail)) return body.detail.map((d) => (d.loc || []).slice(1).join(".") + ": " + d.msg).join("; ");
    if (body && body.detail) return String(body.detail);
    return "request failed";
  }

  async function refresh() {
    let runs;
    try {
      const response = await api("/web/api/runs");
      runs = await response.json();
    } catch (error) {
      if (error instanceof Unauthorized) { askForToken(sessionStorage.getItem(TOKEN_KEY) ? "That token was refused." : ""); return; }
      schedule(3000);
      return;
    }
    $("token-panel").hidden = true;
    $("web-main").hidden = false;
    $("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY);
    if (Date.now() - serverFetched > 10000) await fetchServer();
    showRuns(runs);
    schedule(runs.some((run) => run.state === "running") ? 400 : 5000);
  }

  /* Which server this page is, and what of the shared results directory it does not list (other servers' rows). */
  async function fetchServer() {
    try {
      const response = await api("/web/api/server");
      if (!response.ok) return;
      server = await response.json();
      serverFetched = Date.now();
    } catch (error) {
      return;
    }
    const origin = server.origin;
    $("this-server").textContent = "This server: " + origin.address + " (pid " + origin.pid + ", started " + started(origin.started_at) + ").";
    const others = server.others;
    const where = Object.entries(others.addresses).map(([address, count]) => address + ": " + count);
    if (others.unknown) where.push("saved by an older version: " + others.unknown);
    $("others-note").textContent = others.rows ? "Not listed: " + others.rows + " rollout(s) of other servers sharing its results directory (" +
      where.join(", ") + "); see them on those servers' /web, or open a file with opencode-env view." : "";
  }

  function serverCell(run) {
    const origin = run.server;
    if (!origin) return el("td", { class: "run-server muted", text: "unknown" });
    const detail = origin.address + ", pid " + origin.pid + ", started " + new Date(origin.started_at * 1000).toISOString();
    if (server && origin.instance === server.origin.instance) return el("td", { class: "run-server this-server", title: detail, text: "this server" });
    return el("td", { class: "run-server", title: detail, text: "earlier server here (pid " + origin.pid + ")" });
  }

  function schedule(ms) {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(refresh, ms);
  }

  function stepClass(run, phase, i, current, seen) {
    if (run.state === "running") return i === current ? "current" : seen.has(phase) || i < current ? "done" : "";
    if (run.failed_phase === phase) return "failed";
    return seen.has(phase) || i < current || (!run.failed_phase && i === current) ? "done" : "";
  }

  function steps(run) {
    const current = PHASES.indexOf(run.phase);
    const seen = new Set((run.events || []).map((e) => e.phase));
    return el("div", { class: "phase-steps" }, PHASES.map((phase, i) => el("span", { class: stepClass(run, phase, i, current, seen), text: phase })));
  }

  function phaseText(run) {
    if (run.state !== "running") return run.message || run.state;
    return (run.phase || "starting") + (run.message ? ": " + run.message : "");
  }

  function showRuns(runs) {
    const body = $("runs").querySelector("tbody");
    body.textContent = "";
    for (const run of runs) {
      const view = el("button", { class: "view-run", text: "view", disabled: run.state !== "finished" ? "disabled" : null });
      const download = el("button", { class: "download-run", text: "JSON", disabled: run.state !== "finished" ? "disabled" : null });
      view.addEventListener("click", () => openRun(run));
      download.addEventListener("click", () => downloadRun(run));
      body.append(el("tr", { id: "run-" + run.id, "data-state": run.state },
        el("td", { title: new Date(run.started_at * 1000).toISOString(), text: started(run.started_at) }),
        el("td", { class: "run-task", title: run.task_id || run.instruction_head, text: run.task_id || run.instruction_head.slice(0, 40) }),
        serverCell(run),
        el("td", { class: "run-state", text: run.state }),
        el("td", {}, el("div", { class: "run-phase", text: phaseText(run) }), steps(run)),
        el("td", {}, run.status ? el("span", { class: "run-status badge " + (run.status === "completed" ? "ok" : "bad"), text: run.status }) : null,
          run.error ? el("div", { class: "error-text", text: run.error.slice(0, 300) }) : null),
        el("td", { class: "run-reward", text: typeof run.reward !== "number" ? "" : Number.isInteger(run.reward) ? run.reward.toFixed(1) : String(run.reward) }),
        el("td", {}, view, " ", download)));
    }
    if (!runs.length) body.append(el("tr", {}, el("td", { colspan: "8", class: "muted", text: "no runs yet" })));
  }

  function started(epoch) {
    const when = new Date(epoch * 1000);
    const today = when.toDateString() === new Date().toDateString();
    return today ? when.toLocaleTimeString() : when.toLocaleString();
  }

  async function fetchResult(run) {
    const response = await api("/web/api/runs/" + encodeURIComponent(run.id) + "/result");
    if (!response.ok) throw new Error(problem(await response.json()));
    return response.text();
  }

  async function openRun(run) {
    try {
      const result = JSON.parse(await fetchResult(run));
      const training = await api("/web/api/runs/" + encodeURIComponent(run.id) + "/training");
      window.OpencodeViewer.render($("viewer"), result, training.ok ? await training.json() : undefined);
      $("viewer").scrollIntoView();
    } catch (error) {
      if (error instanceof Unauthorized) askForToken("That token was refused."); else $("run-error").textContent = String(error.message);
    }
  }

  async function downloadRun(run) {
    const text = await fetchResult(run);
    const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
    const link = el("a", { href: url, download: (run.task_id || "rollout") + "-" + run.id + ".json" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  function lines(value) {
    return value.split("\n").map((line) => line.trim()).filter(Boolean);
  }

  async function submitRun(event) {
    event.preventDefault();
    const form = new FormData(event.target);
    const request = { instruction: form.get("instruction"), setup: lines(form.get("setup")), verify: lines(form.get("verify")), mode: form.get("mode") };
    if (lines(form.get("solution")).length) request.solution = lines(form.get("solution"));
    for (const name of ["endpoint", "base_url", "model", "api_key", "task_id"]) if (form.get(name)) request[name] = form.get(name);
    if (form.get("agent_timeout_s")) request.agent_timeout_s = Number(form.get("agent_timeout_s"));
    $("run-error").textContent = "";
    try {
      const response = await api("/web/api/runs", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(request) });
      if (!response.ok) { $("run-error").textContent = problem(await response.json()); return; }
    } catch (error) {
      if (error instanceof Unauthorized) { askForToken("That token was refused."); return; }
      $("run-error").textContent = String(error.message);
      return;
    }
    refresh();
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
    $("token-input").value = "";
    refresh();
  });
  $("forget-token").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); refresh(); });
  $("run-form").addEventListener("submit", submitRun);
  refresh();
})();
