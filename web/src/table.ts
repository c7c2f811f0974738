// The top stacks: verdict, kind, where, bytes, blocks, age and slope; sorted by any column and
// filtered by text, verdict and kind.

import type { Stack } from './api';
import { byId, el, fill } from './dom';
import { bytes, count, seconds, slope } from './format';

type Key = 'verdict' | 'kind' | 'site' | 'pid' | 'bytes' | 'blocks' | 'oldest_age_s' | 'slope';

const COLUMNS: [Key, string][] = [
  ['verdict', 'Verdict'],
  ['kind', 'Kind'],
  ['site', 'Where'],
  ['pid', 'PID'],
  ['bytes', 'Bytes'],
  ['blocks', 'Blocks'],
  ['oldest_age_s', 'Oldest'],
  ['slope', 'Slope'],
];

/// Verdicts in the order that matters to someone hunting a leak.
const VERDICT_RANK: Record<string, number> = {
  leak: 0,
  retention: 1,
  moved: 2,
  under_tensors: 2,
  under_heap: 2,
  under_objects: 2,
  imported: 4,
  spike: 3,
  bounded_cache: 4,
  steady: 5,
};

export class StackTable {
  private rows: Stack[] = [];
  private sortKey: Key = 'bytes';
  private descending = true;
  private per = 'second';
  private selected: string | null = null;
  private readonly text = byId<HTMLInputElement>('filter-text');
  private readonly verdict = byId<HTMLSelectElement>('filter-verdict');
  private readonly kind = byId<HTMLSelectElement>('filter-kind');

  constructor(
    private readonly host: HTMLTableElement,
    private readonly onSelect: (id: string) => void,
  ) {
    for (const input of [this.text, this.verdict, this.kind]) {
      input.addEventListener('input', () => this.render());
    }
  }

  set(rows: Stack[], per: string): void {
    this.rows = rows;
    this.per = per;
    const kinds = [...new Set(rows.map((r) => r.kind))].sort();
    const current = this.kind.value;
    fill(this.kind, el('option', { value: '' }, 'all kinds'), ...kinds.map((k) => el('option', { value: k }, k)));
    this.kind.value = kinds.includes(current) ? current : '';
    this.render();
  }

  select(id: string | null): void {
    this.selected = id;
    this.render();
  }

  private visible(): Stack[] {
    const text = this.text.value.trim().toLowerCase();
    const verdict = this.verdict.value;
    const kind = this.kind.value;
    const rows = this.rows.filter(
      (r) =>
        (!text || `${r.site} ${r.kind} ${r.verdict ?? ''} ${r.pid}`.toLowerCase().includes(text)) &&
        (!verdict || (r.verdict ?? 'none') === verdict) &&
        (!kind || r.kind === kind),
    );
    const key = this.sortKey;
    const value = (r: Stack): number | string =>
      key === 'verdict' ? VERDICT_RANK[r.verdict ?? ''] ?? 9 : (r[key] ?? -Infinity);
    rows.sort((a, b) => {
      const x = value(a);
      const y = value(b);
      const c = x < y ? -1 : x > y ? 1 : 0;
      return this.descending ? -c : c;
    });
    return rows;
  }

  private render(): void {
    const rows = this.visible();
    const head = el(
      'tr',
      {},
      ...COLUMNS.map(([key, label]) => {
        const th = el(
          'th',
          { 'data-key': key, class: key === this.sortKey ? (this.descending ? 'sorted desc' : 'sorted asc') : '' },
          label,
        );
        th.addEventListener('click', () => {
          this.descending = key === this.sortKey ? !this.descending : key !== 'site' && key !== 'kind';
          this.sortKey = key;
          this.render();
        });
        return th;
      }),
    );
    const body = rows.map((r) => {
      const tr = el(
        'tr',
        { 'data-id': r.id, class: (r.id === this.selected ? 'selected ' : '') + (r.verdict ?? 'none') },
        el('td', {}, el('span', { class: `verdict ${r.verdict ?? 'none'}` }, r.verdict ?? '—'), r.released ? ' (released)' : ''),
        el('td', {}, r.kind + (r.inherited ? ' (inherited)' : '')),
        el('td', { class: 'site' }, r.site),
        el('td', { class: 'num' }, r.pid),
        el('td', { class: 'num' }, bytes(r.bytes)),
        el('td', { class: 'num' }, count(r.blocks)),
        el('td', { class: 'num' }, seconds(r.oldest_age_s)),
        el('td', { class: 'num' }, slope(r.slope, this.per)),
      );
      tr.addEventListener('click', () => this.onSelect(r.id));
      return tr;
    });
    fill(
      this.host,
      el('thead', {}, head),
      el('tbody', {}, ...body),
    );
    this.host.dataset.rows = String(rows.length);
    if (!rows.length) {
      this.host.tBodies[0].append(el('tr', {}, el('td', { colspan: COLUMNS.length, class: 'muted' }, 'No stack matches.')));
    }
  }
}
