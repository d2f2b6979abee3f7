/* smelt's status page: jobs and the queue, one job's live curves, events, checkpoints and
 * log, the cluster, files, and a form to start a job (an RL job's own view: rl.js). Plain browser JavaScript, no build
 * step. Everything from the API is inserted as text (textContent / text nodes), never as
 * HTML. API paths are relative so the page also works behind a path-prefix proxy. */
'use strict';

const KEY_STORAGE = 'smelt.apiKey';
const POLL_MS = 3000;
const FILES_POLL_MS = 15000;
const LOG_TAIL_BYTES = 20000;
const MAX_EVENTS_SHOWN = 500;
const STREAM_RETRY_MS = 2000;
const STREAM_RETRY_MAX_MS = 30000;

/* ---------------------------------------------------------------- DOM helpers */

const $ = (id) => document.getElementById(id);

/* el('td', {className: 'mono', title: x}, 'text', childNode, ...): strings become text nodes. */
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null) continue;
    if (k === 'dataset') Object.assign(node.dataset, v);
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else if (k in node) node[k] = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function setText(id, text) {
  $(id).textContent = text === null || text === undefined ? '' : String(text);
}

function fmtTime(ts) {
  if (ts === null || ts === undefined) return '—';
  return new Date(ts * 1000).toLocaleString();
}

function fmtAgo(ts) {
  if (ts === null || ts === undefined) return '—';
  return fmtDuration(Math.max(0, Date.now() / 1000 - ts)) + ' ago';
}

function fmtDuration(s) {
  s = Math.round(s);
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
  return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
}

function fmtBytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + ' ' + units[i];
}

function fmtNumber(v) {
  if (typeof v !== 'number' || !isFinite(v)) return '—';
  if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e6)) return v.toExponential(3);
  if (Math.abs(v) >= 100) return String(Math.round(v));
  return String(Math.round(v * 10000) / 10000);
}

function statusBadge(status) {
  return el('span', {className: 'badge status-' + String(status)}, status);
}

/* ---------------------------------------------------------------- errors */

class ApiError extends Error {
  constructor(status, message, type, param, code) {
    super(message);
    this.status = status;
    this.type = type || null;
    this.param = param || null;
    this.code = code || null;
  }
  /* "message (HTTP 400 invalid_value, param: hyperparameters.n_epochs)" */
  describe() {
    const bits = [];
    if (this.status) bits.push('HTTP ' + this.status);
    if (this.code) bits.push(this.code);
    let text = this.message;
    if (bits.length || this.param)
      text += ' (' + bits.join(' ') + (this.param ? (bits.length ? ', ' : '') + 'param: ' + this.param : '') + ')';
    return text;
  }
}

function describe(err) {
  if (err instanceof ApiError) return err.describe();
  if (err && err.name === 'TypeError') return 'could not reach smeltd: ' + err.message;
  return err && err.message ? err.message : String(err);
}

/* The banner keeps one line per distinct message (a failing poll repeats itself). */
const shownErrors = new Map();

function reportError(context, err) {
  const text = context + ': ' + describe(err);
  const known = shownErrors.get(text);
  if (known) {
    known.count++;
    known.countNode.textContent = ' ×' + known.count;
    known.timeNode.textContent = new Date().toLocaleTimeString() + ' ';
    return;
  }
  const timeNode = el('span', {className: 'muted'}, new Date().toLocaleTimeString() + ' ');
  const countNode = el('span', {className: 'muted'});
  const item = el('li', {}, timeNode, text, countNode);
  shownErrors.set(text, {count: 1, countNode, timeNode, item});
  $('error-list').prepend(item);
  $('errors').hidden = false;
}

function clearErrors() {
  shownErrors.clear();
  $('error-list').replaceChildren();
  $('errors').hidden = true;
}

function showInlineError(id, err) {
  const node = $(id);
  if (!err) {
    node.hidden = true;
    node.textContent = '';
    return;
  }
  node.textContent = typeof err === 'string' ? err : describe(err);
  node.hidden = false;
}

/* ---------------------------------------------------------------- the API */

const state = {
  key: '',
  pollTimer: null,
  filesTimer: null,
  jobs: [],
  queue: new Map(),          // job id -> queue entry (position, reason)
  files: [],
  selected: null,            // the job shown in #job-detail
};

async function parseError(res) {
  const text = await res.text();
  try {
    const e = JSON.parse(text).error;
    if (e && typeof e.message === 'string') return new ApiError(res.status, e.message, e.type, e.param, e.code);
  } catch (_) { /* not the envelope: use the text */ }
  return new ApiError(res.status, text.trim().slice(0, 300) || res.statusText || 'request failed');
}

/* api('GET', 'v1/fine_tuning/jobs') -> parsed JSON. opts: {json, form, text: true, signal}. */
async function api(method, path, opts = {}) {
  if (!state.key) throw new ApiError(0, 'no API key: enter one at the top of the page');
  const headers = {'Authorization': 'Bearer ' + state.key};
  let body;
  if (opts.json !== undefined) {
    headers['Content-Type'] = 'application/json';
    body = JSON.stringify(opts.json);
  } else if (opts.form) {
    body = opts.form;  // the browser sets the multipart boundary
  }
  const res = await fetch(path, {method, headers, body, signal: opts.signal, cache: 'no-store'});
  if (!res.ok) {
    const err = await parseError(res);
    if (res.status === 401) onKeyRefused(err);
    throw err;
  }
  return opts.text ? res.text() : res.json();
}

/* ---------------------------------------------------------------- the key */

function onKeyRefused(err) {
  stopPolling();
  setText('key-status', 'key refused');
  $('key-status').className = 'error-text';
  reportError('API key', err);
}

function useKey(key) {
  state.key = key;
  $('api-key').value = key;
  setText('key-status', key ? 'key saved in this browser' : 'enter an API key to start');
  $('key-status').className = 'muted';
  if (key) startPolling();
  else stopPolling();
}

function initKey() {
  $('key-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const key = $('api-key').value.trim();
    if (!key) {
      setText('key-status', 'the key is empty');
      return;
    }
    localStorage.setItem(KEY_STORAGE, key);
    clearErrors();
    useKey(key);
  });
  $('forget-key').addEventListener('click', () => {
    localStorage.removeItem(KEY_STORAGE);
    useKey('');
    closeDetail();
    clearViews();
  });
  useKey(localStorage.getItem(KEY_STORAGE) || '');
}

function clearViews() {
  state.jobs = [];
  state.files = [];
  state.queue = new Map();
  $('jobs-table').tBodies[0].replaceChildren();
  $('agents-table').tBodies[0].replaceChildren();
  $('queue-table').tBodies[0].replaceChildren();
  $('files-table').tBodies[0].replaceChildren();
  $('submit-model').replaceChildren();
  $('submit-training-file').replaceChildren();
  $('submit-validation-file').replaceChildren();
  setText('jobs-updated', '');
}

/* ---------------------------------------------------------------- polling */

function startPolling() {
  stopPolling();
  pollNow();
  state.pollTimer = setInterval(pollNow, POLL_MS);
  refreshFiles();
  refreshModels();
  state.filesTimer = setInterval(refreshFiles, FILES_POLL_MS);
}

function stopPolling() {
  clearInterval(state.pollTimer);
  clearInterval(state.filesTimer);
  state.pollTimer = state.filesTimer = null;
}

let polling = false;
async function pollNow() {
  if (polling) return;  // a slow server: do not pile requests up
  polling = true;
  try {
    await Promise.all([refreshJobs(), refreshCluster(), state.selected ? refreshDetail() : null]);
  } finally {
    polling = false;
  }
}

/* ---------------------------------------------------------------- jobs list */

async function refreshJobs() {
  let list;
  try {
    list = await api('GET', 'v1/fine_tuning/jobs?limit=100');
  } catch (err) {
    reportError('Listing jobs', err);
    return;
  }
  state.jobs = list.data || [];
  renderJobs();
  setText('jobs-updated', 'updated ' + new Date().toLocaleTimeString());
}

/* The detail learns of status changes first (from events): keep its row in step. */
function updateJobRow(job) {
  const i = state.jobs.findIndex((j) => j.id === job.id);
  if (i < 0 || state.jobs[i].status === job.status && state.jobs[i].fine_tuned_model === job.fine_tuned_model) return;
  state.jobs[i] = job;
  renderJobs();
}

function renderJobs() {
  const rows = state.jobs.map((job) => {
    const q = state.queue.get(job.id);
    const status = statusBadge(job.status);
    const statusCell = el('td', {}, status);
    if (job.status === 'queued' && q) statusCell.append(el('span', {className: 'muted'}, ' #' + q.position));
    const tr = el('tr', {dataset: {jobId: job.id}, tabIndex: 0, title: 'show this job'},
      el('td', {className: 'mono'}, job.id),
      statusCell,
      el('td', {}, job.model),
      el('td', {}, fmtTime(job.created_at)),
      el('td', {className: 'mono'}, job.fine_tuned_model || '—'));
    if (state.selected && state.selected.id === job.id) tr.classList.add('selected');
    tr.addEventListener('click', () => selectJob(job.id));
    tr.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') selectJob(job.id); });
    return tr;
  });
  $('jobs-table').tBodies[0].replaceChildren(...rows);
  $('jobs-empty').hidden = rows.length > 0;
}

/* ---------------------------------------------------------------- cluster */

async function refreshCluster() {
  let c;
  try {
    c = await api('GET', 'v1/cluster');
  } catch (err) {
    reportError('Reading the cluster', err);
    return;
  }
  state.queue = new Map((c.queue || []).filter((q) => q.job_id).map((q) => [q.job_id, q]));
  renderCluster(c);
  renderJobs();
}

function jobLink(id) {
  if (!id) return el('span', {className: 'muted'}, 'another project');
  if (!id.startsWith('ftjob-')) return el('span', {className: 'muted'}, id);
  return el('a', {href: '#job-detail', className: 'mono', onclick: (ev) => { ev.preventDefault(); selectJob(id); }}, id);
}

function renderCluster(c) {
  const agents = (c.agents || []).map((a) => {
    const devices = el('ul', {className: 'devices'}, ...(a.devices || []).map((d) =>
      el('li', {className: 'device state-' + d.state},
        el('span', {className: 'mono'}, d.kind + ':' + d.index), ' ',
        d.name ? el('span', {className: 'muted'}, d.name + (d.memory_bytes ? ', ' + fmtBytes(d.memory_bytes) : '') + ' ') : null,
        el('span', {className: 'badge state-' + d.state}, d.state),
        d.job_id ? el('span', {}, ' ', jobLink(d.job_id)) : null)));
    return el('tr', {},
      el('td', {className: 'mono'}, a.id),
      el('td', {}, a.hostname),
      el('td', {}, el('span', {className: 'badge agent-' + a.status}, a.status)),
      el('td', {}, fmtAgo(a.last_seen)),
      el('td', {}, el('span', {className: 'muted'}, a.free_devices + ' free'), devices));
  });
  /* How agents connect (docs/security.md): "insecure" is --insecure-agents, said plainly. */
  const insecure = c.agents_security === 'insecure';
  $('agents-security').replaceChildren(insecure
    ? el('span', {className: 'badge status-failed'}, 'agents: insecure (no CURVE; --insecure-agents)')
    : el('span', {}, 'Agents connect with CURVE: enrolled credentials, encrypted traffic.'));
  $('agents-table').tBodies[0].replaceChildren(...agents);
  $('agents-empty').hidden = agents.length > 0;
  const queue = (c.queue || []).map((q) => el('tr', {},
    el('td', {}, q.position),
    el('td', {}, jobLink(q.job_id)),
    el('td', {}, q.priority),
    el('td', {}, q.devices_wanted),
    el('td', {}, fmtDuration(q.waiting_seconds || 0)),
    el('td', {}, q.reason)));
  $('queue-table').tBodies[0].replaceChildren(...queue);
  $('queue-empty').hidden = queue.length > 0;
}

/* ---------------------------------------------------------------- charts */

/* Which metric names feed which curve. Training lines use `loss`/`lr` (metrics.jsonl), the
 * events use `train_loss`/`learning_rate`; the RL names are the ones the RL trainers are
 * expected to report, and their charts stay hidden until such a value arrives. A DPO job's
 * reward margin and preference accuracy (TRL's names on train lines and step events, after
 * `val_` on eval lines and events) share the loss chart on a second axis (`axis: 'y2'`):
 * they are read against the loss, step by step. */
const SERIES = [
  {chart: 'loss', name: 'train', keys: ['train_loss', 'loss'], types: ['train', undefined]},
  {chart: 'loss', name: 'validation', keys: ['valid_loss', 'val_loss']},
  {chart: 'loss', name: 'reward margin', keys: ['rewards/margins'], axis: 'y2'},
  {chart: 'loss', name: 'preference accuracy', keys: ['rewards/accuracies'], axis: 'y2'},
  {chart: 'loss', name: 'val. reward margin', keys: ['val_rewards/margins'], axis: 'y2'},
  {chart: 'loss', name: 'val. preference accuracy', keys: ['val_rewards/accuracies'], axis: 'y2'},
  {chart: 'lr', name: 'learning rate', keys: ['learning_rate', 'lr']},
  {chart: 'grad', name: 'grad norm', keys: ['grad_norm']},
  {chart: 'tps', name: 'tokens/s', keys: ['tokens_per_s']},
  {chart: 'reward', name: 'reward', keys: ['reward', 'reward_mean', 'mean_reward', 'rewards']},
  {chart: 'reward', name: 'val. reward', keys: ['val_reward']},
  {chart: 'reward', name: 'val. accuracy', keys: ['val_accuracy']},
  {chart: 'kl', name: 'KL', keys: ['kl', 'kl_mean', 'mean_kl', 'kl_div']},
  {chart: 'kl', name: 'rollout/trainer |Δlogprob|', keys: ['rollout/logprob_diff_mean']},
  {chart: 'length', name: 'length', keys: ['completions/mean_length', 'response_length', 'mean_response_length',
                                          'length', 'gen_len']},
  // an RL iteration's rewards: the band of the train lines (each grader's mean is added by grader)
  {chart: 'dist', name: 'min', keys: ['reward_min'], types: ['train', undefined]},
  {chart: 'dist', name: 'mean', keys: ['reward'], types: ['train', undefined]},
  {chart: 'dist', name: 'max', keys: ['reward_max'], types: ['train', undefined]},
  {chart: 'dist', name: 'std', keys: ['reward_std'], types: ['train', undefined], axis: 'y2'},
  // PPO's value model
  {chart: 'critic', name: 'value loss', keys: ['critic/vf_loss']},
  {chart: 'critic', name: 'value mean', keys: ['critic/vpred_mean']},
  {chart: 'critic', name: 'returns mean', keys: ['critic/returns_mean']},
  {chart: 'critic', name: 'value clip fraction', keys: ['critic/vf_clipfrac'], axis: 'y2'},
  {chart: 'critic', name: 'explained variance', keys: ['critic/explained_variance', 'explained_variance'], axis: 'y2'},
];
const CHARTS = ['loss', 'lr', 'grad', 'tps', 'reward', 'kl', 'length', 'dist', 'critic'];
const OPTIONAL_CHARTS = new Set(['reward', 'kl', 'length', 'dist', 'critic']);
const Y2_TITLES = {loss: 'margin / accuracy', dist: 'std', critic: 'fraction'};
/* A train line's per-grader (per-verifier) mean reward: one curve per grader on the reward chart. */
const GRADER_KEY = /^rewards\/(.+)\/mean$/;
const RL_METHODS = new Set(['grpo', 'ppo', 'reinforcement']);
const COLORS = ['#2563eb', '#dc2626', '#059669', '#d97706', '#7c3aed', '#0891b2', '#65a30d', '#db2777'];

const charts = {};        // chart name -> {chart (Chart or null), series: [{name, points: Map step->value}]}
let chartsDirty = false;

function chartsAvailable() {
  return typeof window.Chart === 'function';
}

function resetCharts() {
  for (const name of CHARTS) {
    if (charts[name] && charts[name].chart) charts[name].chart.destroy();
    charts[name] = {chart: null, series: []};
    const canvas = $(name + '-chart');
    canvas.dataset.points = '0';
    setText(name + '-chart-last', '');
    if (OPTIONAL_CHARTS.has(name)) $(name + '-chart-figure').hidden = true;
  }
  $('charts-unavailable').hidden = chartsAvailable();
  resetRlView();
}

function ensureChart(name) {
  const c = charts[name];
  if (c.chart || !chartsAvailable()) return;
  c.chart = new window.Chart($(name + '-chart'), {
    type: 'line',
    data: {datasets: []},
    options: {
      animation: false,
      parsing: false,
      normalized: true,
      responsive: true,
      maintainAspectRatio: false,
      interaction: {mode: 'nearest', axis: 'x', intersect: false},
      elements: {point: {radius: 0, hitRadius: 6}, line: {borderWidth: 1.5}},
      plugins: {legend: {display: false, labels: {boxWidth: 12}}},
      scales: {
        x: {type: 'linear', title: {display: true, text: 'step'}, ticks: {precision: 0}},
        y: {type: 'linear', ticks: {callback: (v) => fmtNumber(v)}},
        // shown only while a series is drawn on it (DPO's margin and accuracy)
        y2: {type: 'linear', position: 'right', display: 'auto', grid: {drawOnChartArea: false},
             title: {display: true, text: Y2_TITLES[name] || ''}, ticks: {callback: (v) => fmtNumber(v)}},
      },
    },
  });
}

/* One metrics record (a metrics.jsonl line or an event's data) at `step`. */
function absorbMetrics(step, record) {
  if (!Number.isInteger(step) || !record || typeof record !== 'object') return;
  if (record.type === 'samples' || record.type === 'sample_errors') {
    absorbRlIteration(step, record);
    return;
  }
  for (const s of SERIES) {
    if (s.types && !s.types.includes(record.type)) continue;
    const key = s.keys.find((k) => typeof record[k] === 'number' && isFinite(record[k]));
    if (key !== undefined) addPoint(s.chart, s.name, s.axis, step, record[key]);
  }
  if (record.type === 'train' || record.type === undefined) absorbGraderRewards(step, record);
  if (typeof record.val_reward === 'number') absorbEvalRun(step, record);
  if (typeof record.total_steps === 'number' && record.total_steps > 0 && state.selected)
    state.selected.totalSteps = record.total_steps;
  if (state.selected && step > (state.selected.lastStep || 0) && record.type !== 'start')
    state.selected.lastStep = step;
  scheduleChartDraw();
}

function addPoint(chart, name, axis, step, value) {
  const c = charts[chart];
  let series = c.series.find((x) => x.name === name);
  if (!series) {
    series = {name, axis: axis || 'y', points: new Map()};
    c.series.push(series);
  }
  series.points.set(step, value);  // keyed by step: history and stream may overlap
  if (OPTIONAL_CHARTS.has(chart)) $(chart + '-chart-figure').hidden = false;
  chartsDirty = true;
}

/* rewards/<grader>/mean -> a curve named after the grader beside the total reward (a
 * grader named like a fixed curve gets " (grader)"). */
function absorbGraderRewards(step, record) {
  const fixed = new Set(SERIES.filter((s) => s.chart === 'reward').map((s) => s.name));
  for (const [k, v] of Object.entries(record)) {
    const m = GRADER_KEY.exec(k);
    if (!m || typeof v !== 'number' || !isFinite(v)) continue;
    addPoint('reward', fixed.has(m[1]) ? m[1] + ' (grader)' : m[1], 'y', step, v);
    showRlView();
  }
}

let drawPending = false;
function scheduleChartDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    if (chartsDirty) drawCharts();
  });
}

function drawCharts() {
  chartsDirty = false;
  drawHistogram();
  for (const name of CHARTS) {
    const c = charts[name];
    let total = 0;
    const lastBits = [];
    const datasets = c.series.map((s, i) => {
      const data = [...s.points.entries()].sort((a, b) => a[0] - b[0]).map(([x, y]) => ({x, y}));
      total += data.length;
      if (data.length) lastBits.push((c.series.length > 1 ? s.name + ' ' : '') + fmtNumber(data[data.length - 1].y));
      return {label: s.name, data, yAxisID: s.axis, borderColor: COLORS[i % COLORS.length],
              backgroundColor: COLORS[i % COLORS.length], pointRadius: data.length < 40 ? 2 : 0};
    });
    $(name + '-chart').dataset.points = String(total);
    setText(name + '-chart-last', lastBits.length ? '(last: ' + lastBits.join(', ') + ')' : '');
    if (!total) continue;
    ensureChart(name);
    if (!c.chart) continue;
    c.chart.data.datasets = datasets;
    c.chart.options.plugins.legend.display = datasets.length > 1;
    c.chart.update('none');
  }
  renderProgress();
}

/* ---------------------------------------------------------------- one job */

function closeDetail() {
  if (state.selected) stopStream(state.selected);
  state.selected = null;
  $('job-detail').hidden = true;
  renderJobs();
}

async function selectJob(id) {
  if (state.selected && state.selected.id === id) {
    $('job-detail').scrollIntoView({block: 'start'});
    return;
  }
  closeDetail();
  const sel = {id, job: null, lastEventId: null, events: new Set(), abort: null, streamEnded: false,
               retryMs: STREAM_RETRY_MS, retryTimer: null, totalSteps: 0, lastStep: 0};
  state.selected = sel;
  resetCharts();
  $('events').replaceChildren();
  $('checkpoints').tBodies[0].replaceChildren();
  $('log').textContent = '';
  $('detail-fields').replaceChildren();
  showInlineError('detail-error', null);
  setText('detail-id', id);
  setText('detail-status', '');
  setText('stream-status', 'loading…');
  $('job-detail').hidden = false;
  renderJobs();
  $('job-detail').scrollIntoView({block: 'start'});

  await refreshDetail();
  if (state.selected !== sel) return;
  // History first: the newest events (to know where the stream starts) and all metrics.
  try {
    const page = await api('GET', 'v1/fine_tuning/jobs/' + encodeURIComponent(id) + '/events?limit=' + MAX_EVENTS_SHOWN);
    if (state.selected !== sel) return;
    const events = (page.data || []).slice().reverse();  // the list is newest first
    for (const ev of events) addEvent(sel, ev);
  } catch (err) {
    reportError('Reading the events of ' + id, err);
  }
  await loadMetricsHistory(sel);
  if (state.selected !== sel) return;
  sel.historyLoaded = true;
  startStream(sel);
}

/* The job's metrics rows after the last one read (all of them the first time): the charts'
 * history, then, polled, what the event stream does not carry (an RL iteration's samples). */
async function loadMetricsHistory(sel) {
  let after = sel.metricsAfter || 0;
  for (;;) {
    let page;
    try {
      page = await api('GET', 'v1/fine_tuning/jobs/' + encodeURIComponent(sel.id) + '/metrics?limit=10000&after=' + after);
    } catch (err) {
      reportError('Reading the metrics of ' + sel.id, err);
      return;
    }
    if (state.selected !== sel) return;
    for (const row of page.data || []) {
      const record = Object.assign({}, row.data || {});
      if (record.type === undefined) record.type = row.type;
      absorbMetrics(row.step, record);
      after = Math.max(after, row.id);
      sel.metricsAfter = after;
    }
    if (!page.has_more || !(page.data || []).length) return;
  }
}

async function refreshDetail() {
  const sel = state.selected;
  if (!sel) return;
  const base = 'v1/fine_tuning/jobs/' + encodeURIComponent(sel.id);
  const [job, ckpts, log] = await Promise.allSettled([
    api('GET', base),
    api('GET', base + '/checkpoints?limit=100'),
    api('GET', base + '/logs?tail=' + LOG_TAIL_BYTES, {text: true}),
  ]);
  if (state.selected !== sel) return;
  if (job.status === 'fulfilled') {
    sel.job = job.value;
    renderJobFields(sel);
    updateJobRow(sel.job);
  } else {
    reportError('Reading job ' + sel.id, job.reason);
  }
  if (ckpts.status === 'fulfilled') renderCheckpoints(ckpts.value.data || []);
  else reportError('Reading the checkpoints of ' + sel.id, ckpts.reason);
  if (log.status === 'fulfilled') renderLog(log.value);
  else reportError('Reading the log of ' + sel.id, log.reason);
  if (sel.historyLoaded) await loadMetricsHistory(sel);
}

function field(label, value, mono) {
  return [el('dt', {}, label), el('dd', {className: mono ? 'mono' : ''}, value === null || value === undefined || value === '' ? '—' : value)];
}

function renderJobFields(sel) {
  const j = sel.job;
  $('detail-status').replaceWith(Object.assign(statusBadge(j.status), {id: 'detail-status'}));
  const hp = j.hyperparameters || {};
  const dev = j.devices && j.devices.length ? (j.agent || '?') + ' [' + j.devices.join(', ') + ']' : null;
  const q = state.queue.get(j.id);
  if (j.method && RL_METHODS.has(j.method.type)) showRlView();
  const parts = [
    ...field('Model', j.model),
    ...field('Method', j.method && j.method.type),
    ...field('Created', fmtTime(j.created_at)),
    ...field('Started', fmtTime(j.started_at)),
    ...field('Finished', fmtTime(j.finished_at)),
    ...field('Fine-tuned model', j.fine_tuned_model, true),
    ...field('Training file', j.training_file, true),
    ...field('Validation file', j.validation_file, true),
    ...field('Epochs / batch / LR ×', [hp.n_epochs, hp.batch_size, hp.learning_rate_multiplier !== undefined
      ? fmtNumber(hp.learning_rate_multiplier) : undefined].map((v) => v === undefined ? 'auto' : v).join(' / ')),
    ...field('Progress', progressText(sel)),
    ...field('Trained tokens', j.trained_tokens),
    ...field('Attempt / retries', (j.attempt ?? 0) + ' / ' + (j.retries ?? 0) + ' of ' + (j.max_retries ?? 0)),
    ...field('Devices', dev, true),
    ...field('Priority', j.priority),
  ];
  if (q) parts.push(...field('Queue', '#' + q.position + ': ' + q.reason));
  if (j.lora) parts.push(...field('LoRA', JSON.stringify(j.lora), true));
  if (j.schedule_id) parts.push(...field('Schedule', j.schedule_id, true));
  if (j.error && (j.error.message || j.error.code))
    parts.push(el('dt', {className: 'error-text'}, 'Error'),
      el('dd', {className: 'error-text'}, (j.error.code ? j.error.code + ': ' : '') + (j.error.message || '')));
  $('detail-fields').replaceChildren(...parts);
  const st = j.status;
  $('cancel-job').disabled = ['succeeded', 'failed', 'cancelled'].includes(st);
  $('pause-job').disabled = !['queued', 'running'].includes(st);
  $('resume-job').disabled = st !== 'paused';
  renderProgress();
}

function progressText(sel) {
  if (!sel.totalSteps) return sel.lastStep ? 'step ' + sel.lastStep : null;
  return 'step ' + sel.lastStep + ' / ' + sel.totalSteps + ' (' + Math.round(100 * sel.lastStep / sel.totalSteps) + '%)';
}

function renderProgress() {
  const sel = state.selected;
  const bar = $('detail-progress-bar');
  let pct = 0;
  if (sel && sel.totalSteps) pct = Math.min(100, 100 * sel.lastStep / sel.totalSteps);
  if (sel && sel.job && sel.job.status === 'succeeded') pct = 100;
  bar.style.width = pct + '%';
}

function renderCheckpoints(list) {
  const rows = list.map((c) => el('tr', {},
    el('td', {}, c.step_number),
    el('td', {className: 'mono'}, c.fine_tuned_model_checkpoint),
    el('td', {}, fmtNumber(c.metrics && c.metrics.train_loss)),
    el('td', {}, fmtTime(c.created_at))));
  $('checkpoints').tBodies[0].replaceChildren(...rows);
  $('checkpoints-empty').hidden = rows.length > 0;
}

function renderLog(text) {
  const pre = $('log');
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
  if (pre.textContent !== text) {
    pre.textContent = text || '(no log yet)';
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }
}

function eventNumber(id) {
  const m = /^ftevent-(\d+)$/.exec(String(id));
  return m ? Number(m[1]) : -1;
}

function addEvent(sel, ev) {
  if (!ev || !ev.id || sel.events.has(ev.id)) return;
  sel.events.add(ev.id);
  if (sel.lastEventId === null || eventNumber(ev.id) > eventNumber(sel.lastEventId)) sel.lastEventId = ev.id;
  const item = el('li', {className: 'level-' + ev.level, dataset: {eventId: ev.id, type: ev.type || ''}},
    el('span', {className: 'muted'}, fmtTime(ev.created_at) + ' '),
    ev.level && ev.level !== 'info' ? el('span', {className: 'badge level-' + ev.level}, ev.level) : null,
    ev.level && ev.level !== 'info' ? ' ' : null,
    ev.message);
  const list = $('events');
  list.prepend(item);  // newest on top
  while (list.children.length > MAX_EVENTS_SHOWN) list.lastElementChild.remove();
  if (ev.type === 'metrics' && ev.data && Number.isInteger(ev.data.step)) absorbMetrics(ev.data.step, ev.data);
  // Status changes are announced by events: look at the job now instead of at the next poll.
  if (ev.type === 'message' && sel.job && sel === state.selected && !sel.refreshQueued) {
    sel.refreshQueued = true;
    setTimeout(() => { sel.refreshQueued = false; if (state.selected === sel) refreshDetail(); }, 300);
  }
}

/* ---------------------------------------------------------------- the event stream */

/* EventSource cannot send an Authorization header, so the stream is read with fetch():
 * records are split on blank lines and parsed here; a dropped connection is resumed with
 * Last-Event-ID; `event: end` means the job is over and nothing more will come. */
function parseSseRecord(block) {
  const rec = {id: null, event: 'message', data: []};
  for (const line of block.split(/\r\n|\r|\n/)) {
    if (!line || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (name === 'id') rec.id = value;
    else if (name === 'event') rec.event = value;
    else if (name === 'data') rec.data.push(value);
  }
  return rec.id === null && rec.data.length === 0 && rec.event === 'message' ? null : rec;
}

function stopStream(sel) {
  clearTimeout(sel.retryTimer);
  if (sel.abort) sel.abort.abort();
  sel.abort = null;
}

async function startStream(sel) {
  if (state.selected !== sel || sel.streamEnded || !state.key) return;
  const controller = new AbortController();
  sel.abort = controller;
  const headers = {'Authorization': 'Bearer ' + state.key, 'Accept': 'text/event-stream'};
  if (sel.lastEventId) headers['Last-Event-ID'] = sel.lastEventId;
  setText('stream-status', 'live: connecting…');
  let fatal = false;
  try {
    const res = await fetch('v1/fine_tuning/jobs/' + encodeURIComponent(sel.id) + '/events',
                            {headers, signal: controller.signal, cache: 'no-store'});
    if (!res.ok) {
      const err = await parseError(res);
      fatal = res.status === 401 || res.status === 404 || res.status === 400;
      if (res.status === 401) onKeyRefused(err);
      throw err;
    }
    if (!res.body) throw new Error('this browser cannot read a streamed response body');
    setText('stream-status', 'live: following events');
    sel.retryMs = STREAM_RETRY_MS;
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(buffer.slice(cut).match(/^\r?\n\r?\n/)[0].length + cut);
        const rec = parseSseRecord(block);
        if (!rec) continue;
        if (rec.event === 'end') {
          sel.streamEnded = true;
          setText('stream-status', 'the job has ended; no more events');
          controller.abort();
          pollNow();  // the job, its row and the freed devices
          return;
        }
        if (rec.event !== 'fine_tuning.job.event') continue;
        let ev;
        try {
          ev = JSON.parse(rec.data.join('\n'));
        } catch (err) {
          reportError('Event stream of ' + sel.id, new Error('an event is not JSON: ' + err.message));
          continue;
        }
        if (!ev.id && rec.id) ev.id = rec.id;
        if (state.selected !== sel) return;
        addEvent(sel, ev);
      }
    }
    if (state.selected !== sel) return;
    setText('stream-status', 'live: connection closed; reconnecting…');
  } catch (err) {
    if (controller.signal.aborted || state.selected !== sel) return;
    reportError('Event stream of ' + sel.id, err);
    setText('stream-status', fatal ? 'live updates stopped: ' + describe(err)
                                   : 'live: disconnected; retrying in ' + Math.round(sel.retryMs / 1000) + ' s');
    if (fatal) return;
  }
  sel.retryTimer = setTimeout(() => startStream(sel), sel.retryMs);
  sel.retryMs = Math.min(sel.retryMs * 2, STREAM_RETRY_MAX_MS);
}

/* ---------------------------------------------------------------- actions */

async function jobAction(action) {
  const sel = state.selected;
  if (!sel) return;
  if (action === 'cancel' && !window.confirm('Cancel job ' + sel.id + '?')) return;
  showInlineError('detail-error', null);
  try {
    sel.job = await api('POST', 'v1/fine_tuning/jobs/' + encodeURIComponent(sel.id) + '/' + action);
    renderJobFields(sel);
    updateJobRow(sel.job);
    if (action === 'resume' && sel.streamEnded) {
      sel.streamEnded = false;
      startStream(sel);
    }
  } catch (err) {
    showInlineError('detail-error', err);
    reportError(action[0].toUpperCase() + action.slice(1) + ' ' + sel.id, err);
  }
  refreshJobs();
}

/* ---------------------------------------------------------------- files */

async function refreshFiles() {
  let list;
  try {
    list = await api('GET', 'v1/files?purpose=fine-tune&limit=1000');
  } catch (err) {
    reportError('Listing files', err);
    return;
  }
  state.files = list.data || [];
  renderFiles();
  renderFileSelects();
}

function issueList(report) {
  const errs = (report && report.errors) || [];
  const items = errs.map((e) => el('li', {},
    el('span', {className: 'mono'}, e.line ? 'line ' + e.line : 'file'),
    e.field ? el('span', {className: 'mono muted'}, ' ' + e.field) : null,
    ': ', e.message));
  const list = el('ul', {className: 'issues'}, ...items);
  if (report && report.errors_total > errs.length)
    list.append(el('li', {className: 'muted'}, '… and ' + (report.errors_total - errs.length) + ' more'));
  return list;
}

function renderFiles() {
  const body = $('files-table').tBodies[0];
  const rows = [];
  for (const f of state.files) {
    const v = f.validation || {};
    const nErr = v.errors_total || 0;
    const toggle = nErr ? el('button', {type: 'button', className: 'secondary small'}, 'errors') : null;
    const tr = el('tr', {dataset: {fileId: f.id}},
      el('td', {className: 'mono'}, f.id),
      el('td', {}, f.filename),
      el('td', {}, fmtBytes(f.bytes)),
      el('td', {}, el('span', {className: 'badge file-' + f.status}, f.status),
        nErr ? el('span', {className: 'error-text'}, ' ' + nErr + ' error' + (nErr > 1 ? 's' : '')) : null),
      el('td', {}, v.examples !== undefined ? v.examples + ' ' + (v.kind || '') : '—'),
      el('td', {}, fmtTime(f.created_at)),
      el('td', {}, toggle));
    rows.push(tr);
    if (toggle) {
      const detail = el('tr', {className: 'issues-row', hidden: true},
        el('td', {colSpan: 7}, issueList(v)));
      toggle.addEventListener('click', () => { detail.hidden = !detail.hidden; });
      rows.push(detail);
    }
  }
  body.replaceChildren(...rows);
  $('files-empty').hidden = state.files.length > 0;
}

function fillSelect(select, options, keepEmpty, emptyLabel) {
  const previous = select.value;
  const nodes = [];
  if (keepEmpty) nodes.push(el('option', {value: ''}, emptyLabel));
  for (const [value, label] of options) nodes.push(el('option', {value}, label));
  select.replaceChildren(...nodes);
  if ([...select.options].some((o) => o.value === previous)) select.value = previous;
}

function renderFileSelects() {
  const usable = state.files.filter((f) => f.status === 'processed')
    .map((f) => [f.id, f.filename + ' (' + f.id + (f.validation ? ', ' + f.validation.examples + ' rows' : '') + ')']);
  fillSelect($('submit-training-file'), usable, usable.length === 0, 'no processed file: upload one');
  fillSelect($('submit-validation-file'), usable, true, 'none');
}

async function uploadFile(ev) {
  ev.preventDefault();
  const input = $('upload-file');
  const out = $('upload-result');
  if (!input.files.length) {
    out.replaceChildren(el('p', {className: 'inline-error'}, 'Choose a file first.'));
    out.hidden = false;
    return;
  }
  const file = input.files[0];
  const form = new FormData();
  form.append('purpose', 'fine-tune');
  form.append('file', file, file.name);
  $('upload-button').disabled = true;
  out.replaceChildren(el('p', {className: 'muted'}, 'Uploading ' + file.name + ' (' + fmtBytes(file.size) + ')…'));
  out.hidden = false;
  try {
    const f = await api('POST', 'v1/files', {form});
    const v = f.validation || {};
    const ok = f.status === 'processed';
    out.replaceChildren(
      el('p', {className: ok ? 'ok-text' : 'error-text'},
        (ok ? 'Uploaded ' : 'Uploaded, but it failed validation: ') + f.filename + ' as ',
        el('span', {className: 'mono'}, f.id),
        ' — ' + (v.examples ?? '?') + ' ' + (v.kind || '') + ' examples in ' + (v.lines ?? '?') + ' lines' +
        (v.errors_total ? ', ' + v.errors_total + ' error' + (v.errors_total > 1 ? 's' : '') : '')),
      v.errors_total ? issueList(v) : '');
    input.value = '';
  } catch (err) {
    out.replaceChildren(el('p', {className: 'inline-error'}, 'Upload refused: ' + describe(err)));
    reportError('Uploading ' + file.name, err);
  } finally {
    $('upload-button').disabled = false;
  }
  refreshFiles();
}

/* ---------------------------------------------------------------- models and the job form */

async function refreshModels() {
  let list;
  try {
    list = await api('GET', 'v1/models');
  } catch (err) {
    reportError('Listing models', err);
    return;
  }
  const models = (list.data || []).map((m) => [m.id, m.id + (m.kind && m.kind !== 'base' ? ' (' + m.kind + ')' : '')]);
  fillSelect($('submit-model'), models, models.length === 0, 'no models found');
}

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/* extra's objects merge into base's (so {"hyperparameters": {"max_steps": 30}} keeps n_epochs). */
function deepMerge(base, extra) {
  const out = Object.assign({}, base);
  for (const [k, v] of Object.entries(extra)) {
    out[k] = isPlainObject(v) && isPlainObject(out[k]) ? deepMerge(out[k], v) : v;
  }
  return out;
}

function buildJobRequest() {
  const req = {model: $('submit-model').value, training_file: $('submit-training-file').value};
  const val = $('submit-validation-file').value;
  if (val) req.validation_file = val;
  const hp = {};
  const epochs = $('submit-epochs').value.trim();
  if (epochs) hp.n_epochs = Number(epochs);
  const mult = $('submit-lr-mult').value.trim();
  if (mult) hp.learning_rate_multiplier = Number(mult);
  if (Object.keys(hp).length) req.hyperparameters = hp;
  const suffix = $('submit-suffix').value.trim();
  if (suffix) req.suffix = suffix;
  const extraText = $('submit-extra').value.trim();
  if (extraText) {
    let extra;
    try {
      extra = JSON.parse(extraText);
    } catch (err) {
      throw new Error('Extra JSON: ' + err.message);
    }
    if (!isPlainObject(extra)) throw new Error('Extra JSON: a JSON object is expected');
    return deepMerge(req, extra);
  }
  return req;
}

async function submitJob(ev) {
  ev.preventDefault();
  showInlineError('submit-error', null);
  setText('submit-result', '');
  let req;
  try {
    req = buildJobRequest();
  } catch (err) {
    showInlineError('submit-error', err.message);
    return;
  }
  $('submit-button').disabled = true;
  try {
    const job = await api('POST', 'v1/fine_tuning/jobs', {json: req});
    setText('submit-result', 'created ' + job.id);
    await refreshJobs();
    selectJob(job.id);
  } catch (err) {
    showInlineError('submit-error', 'The job was refused: ' + describe(err));
  } finally {
    $('submit-button').disabled = false;
  }
}

/* ---------------------------------------------------------------- start */

function init() {
  resetCharts();
  $('clear-errors').addEventListener('click', clearErrors);
  $('close-detail').addEventListener('click', closeDetail);
  $('cancel-job').addEventListener('click', () => jobAction('cancel'));
  $('pause-job').addEventListener('click', () => jobAction('pause'));
  $('resume-job').addEventListener('click', () => jobAction('resume'));
  $('upload-form').addEventListener('submit', uploadFile);
  $('submit-form').addEventListener('submit', submitJob);
  initRlView();
  initKey();
}

document.addEventListener('DOMContentLoaded', init);
