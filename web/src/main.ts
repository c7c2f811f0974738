// The leak explorer: fetches the API, draws each panel, and refreshes on every live update.
// Data flows one way: the API's answers → this module's state → the panels.

import { eventsUrl, get, type FlameNode, type Health, type Process, type Stack, type Timeline, type Update } from './api';
import { TimelineChart } from './charts';
import { StackView } from './detail';
import { DiffView } from './diff';
import { byId, el, fill } from './dom';
import { Flame } from './flame';
import { ProcessTree } from './processes';
import { StackTable } from './table';
import { bytes, count, grouped, seconds } from './format';
import './style.css';

interface State {
  pid: number | null;
  stack: string | null;
  flameKind: string;
  updates: number;
}

const state: State = { pid: null, stack: null, flameKind: '', updates: 0 };

const timeline = new TimelineChart(byId('timeline'));
const tree = new ProcessTree(byId('processes'), (pid) => {
  state.pid = pid;
  void refresh();
});
const table = new StackTable(byId<HTMLTableElement>('stacks'), (id) => void pick(id));
const view = new StackView(byId('stack'), byId('stack-chart'));
const flame = new Flame(byId('flame'), byId('flame-details'));
const diff = new DiffView(byId<HTMLTableElement>('diff'), byId('diff-note'));
const flameKind = byId<HTMLSelectElement>('flame-kind');
flameKind.addEventListener('change', () => {
  state.flameKind = flameKind.value;
  void refreshFlame();
});

async function pick(id: string): Promise<void> {
  state.stack = id;
  table.select(id);
  await view.show(id);
}

function renderStatus(u: Update | Health & { totals?: Record<string, number> }): void {
  const parts: (string | Node)[] = [
    `${u.final ? 'ended after' : 'running'} ${seconds(u.elapsed_s)}`,
    `${count(u.events)} events`,
    `${count(u.steps)} steps`,
  ];
  if ('totals' in u && u.totals) {
    for (const [g, n] of Object.entries(grouped(u.totals))) if (n) parts.push(`${g} ${bytes(n)}`);
  }
  if ('leaks' in u) parts.push(el('span', { class: u.leaks ? 'leaks' : '' }, `${u.leaks} leaking stacks`));
  fill(byId('status'), ...parts.flatMap((p, i) => (i ? [' · ', p] : [p])));
}

function renderHealth(h: Health): void {
  const banner = byId('banner');
  // Counted, not lost: calls inside an outer call, frees of what was made while untraced or by
  // the allocator itself as a thread exited, and frees no block matched.
  const notLost = ['nested_calls', 'unmatched_frees', 'untraced_frees', 'thread_exit_frees'];
  const lost = Object.entries(h.losses).filter(([k, n]) => n > 0 && !notLost.includes(k));
  const most = (f: Health['map_fill'][number]): number => Math.max(f.used, f.peak ?? 0);
  const full = h.map_fill.filter((f) => most(f) * 5 >= f.capacity * 4);
  banner.hidden = h.dropped === 0 && full.length === 0 && h.probe_failures.length === 0;
  fill(
    banner,
    h.dropped > 0 ? el('strong', {}, `${count(h.dropped)} events were lost`) : null,
    h.dropped > 0 ? ': bytes shown are a lower bound. ' : null,
    lost.map(([k, n]) => `${k.replace(/_/g, ' ')} ${count(n)}`).join(', '),
    ...full.map((f) => el('div', {}, `The ${f.name} table reached ${Math.floor((most(f) * 100) / f.capacity)}% full: past it, events are dropped.`)),
    ...h.probe_failures.map((f) => el('div', {}, el('strong', {}, `${f.library} could not be probed for ${f.role}`), `: its calls are not traced (${f.error}).`)),
  );
  fill(
    byId('tables'),
    ...h.map_fill.map((f) => el('li', {}, `${f.name}: ${count(f.used)} of ${count(f.capacity)}${f.peak !== undefined ? ` (at most ${count(f.peak)})` : ''}`)),
  );
  fill(
    byId('libraries'),
    ...h.libraries.map((l) => el('li', {}, el('span', { class: 'module' }, l.path), ` ${l.roles.join(', ')} (${l.when})`)),
  );
  const note = byId('heap-note');
  note.hidden = h.heap.length === 0;
  fill(note, ...h.heap.map((n) => el('div', {}, n)));
  const ms = (ns: number): string => `${(ns / 1e6).toFixed(1)} ms`;
  const total = h.probe_cost.reduce((a, p) => ({ calls: a.calls + p.calls, ns: a.ns + p.ns }), { calls: 0, ns: 0 });
  fill(
    byId('probe-cost'),
    ...(h.probe_cost.length ? [el('li', {}, `probes: ${count(total.calls)} runs, ${ms(total.ns)} in the kernel (the traps not included); the costliest:`)] : []),
    ...h.probe_cost.slice(0, 6).map((p) => el('li', {}, `${p.program}: ${count(p.calls)} runs, ${ms(p.ns)} (${Math.round(p.ns / Math.max(p.calls, 1))} ns each)`)),
  );
}

/// What the stack table does not show: the report's stacks past the 500 asked for, and those
/// past the report's own --top (with what they hold per kind), so that the list and the
/// totals never disagree without a word.
function renderLeftOut(h: Health, shown: number): void {
  const lines: string[] = [];
  if (state.pid === null && shown < h.stacks_listed) {
    lines.push(`The ${count(shown)} largest of the ${count(h.stacks_listed)} stacks in the report are shown.`);
  }
  if (h.unlisted.stacks > 0) {
    const kinds = Object.entries(h.unlisted.totals)
      .filter(([, a]) => a.blocks > 0 || a.bytes > 0)
      .map(([k, a]) => `${k} ${bytes(a.bytes)} in ${count(a.blocks)} block${a.blocks === 1 ? '' : 's'}`);
    lines.push(`${count(h.unlisted.stacks)} smaller stacks are not in the report (--top lists them): ${kinds.join(', ')}.`);
  }
  const p = byId('stacks-left-out');
  p.hidden = lines.length === 0;
  fill(p, ...lines.map((l) => el('span', {}, l, ' ')));
}

let refreshing: Promise<void> | null = null;
let again = false;

/// Re-reads everything the live report changes; one refresh at a time, the last request wins.
function refresh(): Promise<void> {
  if (refreshing) {
    again = true;
    return refreshing;
  }
  refreshing = (async () => {
    try {
      const pid = state.pid === null ? '' : `&pid=${state.pid}`;
      const [health, procs, stacks, tl] = await Promise.all([
        get<Health>('api/v1/health'),
        get<Process[]>('api/v1/processes'),
        get<Stack[]>(`api/v1/stacks?limit=500${pid}`),
        get<Timeline>('api/v1/timeline'),
      ]);
      renderHealth(health);
      if (!state.updates) renderStatus(health);
      tree.render(procs, state.pid);
      table.set(stacks, health.per);
      renderLeftOut(health, stacks.length);
      timeline.update(tl);
      fill(byId('pid-filter'), state.pid === null ? '' : `process ${state.pid} only (click it again for all)`);
      await refreshFlame();
      if (state.stack) await view.show(state.stack);
      byId('conn').dataset.refreshed = String(Date.now());
    } catch (e) {
      fill(byId('error'), (e as Error).message);
    } finally {
      refreshing = null;
    }
    if (again) {
      again = false;
      await refresh();
    }
  })();
  return refreshing;
}

async function refreshFlame(): Promise<void> {
  const q = new URLSearchParams();
  if (state.flameKind) q.set('kind', state.flameKind);
  if (state.pid !== null) q.set('pid', String(state.pid));
  const root = await get<FlameNode>(`api/v1/flamegraph?${q}`);
  const kinds = state.flameKind ? [state.flameKind] : root.children.map((c) => c.name);
  const known = new Set([...flameKind.options].map((o) => o.value));
  for (const k of kinds) if (!known.has(k)) flameKind.append(el('option', { value: k }, k));
  flame.render(root);
}

function connect(): void {
  const conn = byId('conn');
  const events = new EventSource(eventsUrl());
  events.addEventListener('open', () => {
    conn.textContent = 'live';
    conn.className = 'conn live';
  });
  events.addEventListener('update', (e) => {
    const u = JSON.parse((e as MessageEvent<string>).data) as Update;
    state.updates++;
    conn.dataset.updates = String(state.updates);
    renderStatus(u);
    void refresh();
    if (u.final) void diff.refresh();
  });
  events.addEventListener('error', () => {
    conn.textContent = 'disconnected: retrying';
    conn.className = 'conn down';
  });
}

view.clear();
connect();
void refresh().then(() => diff.refresh());
