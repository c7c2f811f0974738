// The traced process tree: each process with its heap, pages and device bytes. Clicking one
// narrows the stacks and the flamegraph to it.

import type { Process } from './api';
import { el, fill } from './dom';
import { bytes, grouped } from './format';

export class ProcessTree {
  constructor(
    private readonly host: HTMLElement,
    private readonly onPick: (pid: number | null) => void,
  ) {}

  render(procs: Process[], picked: number | null): void {
    const pids = new Set(procs.map((p) => p.pid));
    const children = new Map<number | null, Process[]>();
    for (const p of procs) {
      const parent = p.ppid !== null && pids.has(p.ppid) ? p.ppid : null;
      children.set(parent, [...(children.get(parent) ?? []), p]);
    }
    const list = (parent: number | null): HTMLUListElement | null => {
      const kids = children.get(parent);
      if (!kids) return null;
      return el('ul', {}, ...kids.map((p) => this.item(p, picked, list(p.pid))));
    };
    fill(this.host, list(null) ?? el('p', { class: 'muted' }, 'No process yet.'));
  }

  private item(p: Process, picked: number | null, sub: HTMLElement | null): HTMLLIElement {
    const g = grouped(p.bytes);
    const button = el(
      'button',
      { class: 'proc' + (picked === p.pid ? ' picked' : ''), 'data-pid': p.pid, title: p.command },
      el('span', { class: 'pid' }, p.pid),
      ' ',
      el('span', { class: 'cmd' }, p.command || '?'),
      p.exited ? el('span', { class: 'tag' }, 'exited') : null,
      p.retention ? el('span', { class: 'tag warn' }, 'allocator retention') : null,
    );
    button.addEventListener('click', () => this.onPick(picked === p.pid ? null : p.pid));
    const cells = Object.entries(g).map(([group, n]) =>
      el('span', { class: `bytes ${group}${n ? '' : ' zero'}`, title: group }, `${group} ${bytes(n)}`),
    );
    return el('li', {}, button, el('div', { class: 'proc-bytes' }, ...cells), sub);
  }
}
