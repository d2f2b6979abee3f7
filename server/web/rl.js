/* The RL view of smelt's status page (GRPO, PPO and reinforcement jobs): the evaluation
 * runs, each iteration's rewards as a histogram, and its samples (prompt, completion,
 * reward, each grader's score, finish reason) with the rewards that failed, chosen by
 * iteration and filtered by a search box. Fed by app.js's absorbMetrics from the job's
 * metrics rows ("samples", "sample_errors", "eval" lines; docs/job-spec.md, GRPO) and
 * events. Samples are model output: everything is inserted as text, never as HTML. */
'use strict';

const HIST_BINS = 10;            // bins when an iteration has more distinct rewards than this
const SAMPLES_LATEST = '';       // the iteration selector's "follow the newest" choice
const SAMPLES_ALL = 'all';

const rl = {
  iterations: new Map(),         // step -> {samples, rewards, rewardsTotal, errors, failed, zeroed}
  evals: new Map(),              // step -> the eval (or final) record's numbers
  histChart: null,
};

function resetRlView() {
  rl.iterations = new Map();
  rl.evals = new Map();
  if (rl.histChart) rl.histChart.destroy();
  rl.histChart = null;
  $('rl-view').hidden = true;
  $('hist-chart-figure').hidden = true;
  $('hist-chart').dataset.points = '0';
  setText('hist-chart-step', '');
  setText('hist-chart-last', '');
  $('samples-step').replaceChildren(el('option', {value: SAMPLES_LATEST}, 'newest'));
  $('samples-search').value = '';
  $('samples').tBodies[0].replaceChildren();
  $('sample-errors').tBodies[0].replaceChildren();
  $('eval-runs').tBodies[0].replaceChildren();
  $('eval-runs-empty').hidden = false;
  $('samples-figure').hidden = true;
}

function showRlView() {
  $('rl-view').hidden = false;
}

function iteration(step) {
  let it = rl.iterations.get(step);
  if (!it) {
    it = {samples: [], rewards: [], rewardsTotal: 0, errors: [], failed: 0, zeroed: 0};
    rl.iterations.set(step, it);
  }
  return it;
}

/* A "samples" or "sample_errors" record of the iteration ending at step. */
function absorbRlIteration(step, record) {
  const it = iteration(step);
  if (record.type === 'samples') {
    it.samples = Array.isArray(record.samples) ? record.samples.filter((x) => x && typeof x === 'object') : [];
    it.rewards = Array.isArray(record.rewards) ? record.rewards : [];
    it.rewardsTotal = Number.isInteger(record.rewards_total) ? record.rewards_total : it.rewards.length;
  } else {
    it.errors = Array.isArray(record.errors) ? record.errors.filter((e) => e && typeof e === 'object') : [];
    it.failed = Number(record.failed ?? record.count) || 0;
    it.zeroed = Number(record.zeroed) || 0;
  }
  showRlView();
  renderIterationChoices();
  renderSamples();
  chartsDirty = true;
  scheduleChartDraw();
}

/* An eval line (or the final line, or their events) with val_reward. */
function absorbEvalRun(step, record) {
  const run = Object.assign(rl.evals.get(step) || {}, record);
  rl.evals.set(step, run);
  showRlView();
  const rows = [...rl.evals.entries()].sort((a, b) => a[0] - b[0]).map(([s, r]) => el('tr', {dataset: {step: s}},
    el('td', {}, String(s) + (r.type === 'final' ? ' (final)' : '')),
    el('td', {}, fmtNumber(r.val_reward)),
    el('td', {}, fmtNumber(r.val_accuracy)),
    el('td', {}, Number.isInteger(r.val_samples) ? String(r.val_samples) : '—'),
    el('td', {}, Number.isInteger(r.val_samples_failed) ? String(r.val_samples_failed) : '—'),
    el('td', {}, Number.isInteger(r.val_samples_graded_zero) ? String(r.val_samples_graded_zero) : '—')));
  $('eval-runs').tBodies[0].replaceChildren(...rows);
  $('eval-runs-empty').hidden = rows.length > 0;
}

function renderIterationChoices() {
  const select = $('samples-step');
  const previous = select.value;
  const steps = [...rl.iterations.keys()].sort((a, b) => b - a);
  const newest = steps.length ? ' (' + steps[0] + ')' : '';
  select.replaceChildren(el('option', {value: SAMPLES_LATEST}, 'newest' + newest),
    el('option', {value: SAMPLES_ALL}, 'all'),
    ...steps.map((s) => el('option', {value: String(s)}, 'step ' + s)));
  select.value = [...select.options].some((o) => o.value === previous) ? previous : SAMPLES_LATEST;
}

/* The steps the selector picks: the newest, all, or one. */
function chosenSteps() {
  const v = $('samples-step').value;
  const steps = [...rl.iterations.keys()].sort((a, b) => b - a);
  if (v === SAMPLES_ALL) return steps;
  if (v === SAMPLES_LATEST) return steps.slice(0, 1);
  return steps.filter((s) => String(s) === v);
}

function scoresText(scores) {
  if (!scores || typeof scores !== 'object') return '';
  return Object.entries(scores).map(([k, v]) => k + ' ' + (typeof v === 'number' ? fmtNumber(v) : 'failed'))
    .join(', ');
}

function matches(query, ...texts) {
  return !query || texts.some((t) => String(t ?? '').toLowerCase().includes(query));
}

function sampleRow(step, x) {
  const failed = x.reward === null || x.reward === undefined;
  return el('tr', {},
    el('td', {}, String(step)),
    el('td', {className: 'mono sample-text'}, String(x.prompt ?? '')),
    el('td', {className: 'mono sample-text'}, String(x.completion ?? '')),
    el('td', {className: failed ? 'error-text' : ''}, failed ? 'failed' : fmtNumber(x.reward)),
    el('td', {className: 'mono'}, scoresText(x.scores)),
    el('td', {}, String(x.finish_reason ?? '')));
}

function errorRow(step, e) {
  return el('tr', {},
    el('td', {}, String(step)),
    el('td', {}, Number.isInteger(e.line) ? String(e.line) : '—'),
    el('td', {}, e.scored ? 'scored 0' : 'failed: left out'),
    el('td', {className: 'mono sample-text'}, String(e.error ?? '')));
}

/* The chosen iterations' samples and reward errors that match the search box. */
function renderSamples() {
  const query = $('samples-search').value.trim().toLowerCase();
  const rows = [], errors = [];
  let total = 0;
  for (const step of chosenSteps()) {
    const it = rl.iterations.get(step);
    for (const x of it.samples) {
      total++;
      if (matches(query, x.prompt, x.completion, x.finish_reason, scoresText(x.scores))) rows.push(sampleRow(step, x));
    }
    for (const e of it.errors)
      if (matches(query, e.error, e.line)) errors.push(errorRow(step, e));
  }
  $('samples').tBodies[0].replaceChildren(...rows);
  $('sample-errors').tBodies[0].replaceChildren(...errors);
  $('sample-errors').hidden = errors.length === 0;
  setText('samples-count', query ? rows.length + ' of ' + total + ' samples match' : total + ' samples');
  $('samples-figure').hidden = rl.iterations.size === 0;
}

/* The chosen iteration's rewards (the newest when "all" is chosen): a bar per distinct
 * value when there are few (a pass/fail grader), else HIST_BINS equal bins. */
function histogram(rewards) {
  const vals = rewards.filter((v) => typeof v === 'number' && isFinite(v));
  const distinct = [...new Set(vals)].sort((a, b) => a - b);
  if (distinct.length <= HIST_BINS)
    return {labels: distinct.map(fmtNumber), counts: distinct.map((d) => vals.filter((v) => v === d).length)};
  const lo = distinct[0], hi = distinct[distinct.length - 1], w = (hi - lo) / HIST_BINS;
  const counts = new Array(HIST_BINS).fill(0);
  for (const v of vals) counts[Math.min(HIST_BINS - 1, Math.floor((v - lo) / w))]++;
  return {labels: counts.map((_, i) => fmtNumber(lo + i * w) + '…' + fmtNumber(lo + (i + 1) * w)), counts};
}

function drawHistogram() {
  const step = chosenSteps()[0];
  const it = step === undefined ? null : rl.iterations.get(step);
  if (!it || !it.rewards.length) return;
  const h = histogram(it.rewards);
  const failed = it.rewards.length - h.counts.reduce((a, b) => a + b, 0);
  $('hist-chart-figure').hidden = false;
  $('hist-chart').dataset.points = String(it.rewards.length);
  setText('hist-chart-step', String(step));
  setText('hist-chart-last', '(' + it.rewards.length + (it.rewardsTotal > it.rewards.length
    ? ' of ' + it.rewardsTotal : '') + ' samples' + (failed ? ', ' + failed + ' failed' : '') + ')');
  if (!chartsAvailable()) return;
  const data = {labels: h.labels, datasets: [{label: 'samples', data: h.counts, backgroundColor: COLORS[0]}]};
  if (rl.histChart) {
    rl.histChart.data = data;
    rl.histChart.update('none');
    return;
  }
  rl.histChart = new window.Chart($('hist-chart'), {
    type: 'bar', data,
    options: {animation: false, responsive: true, maintainAspectRatio: false, plugins: {legend: {display: false}},
              scales: {x: {title: {display: true, text: 'reward'}},
                       y: {title: {display: true, text: 'samples'}, ticks: {precision: 0}}}},
  });
}

function initRlView() {
  $('samples-step').addEventListener('change', () => {
    renderSamples();
    drawHistogram();
  });
  $('samples-search').addEventListener('input', renderSamples);
}
