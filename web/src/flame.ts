// The flamegraph of outstanding bytes (d3-flame-graph, drawn as an icicle: callers above callees).
// Frames of stacks judged leaks are red. Names reach the SVG only as text.

import flamegraph, { type FlameGraph } from 'd3-flame-graph';
import { select } from 'd3-selection';
import type { FlameNode } from './api';
import { bytes } from './format';

export class Flame {
  private chart: FlameGraph<FlameNode> | null = null;
  private width = 0;

  constructor(
    private readonly host: HTMLElement,
    private readonly details: HTMLElement,
  ) {}

  render(root: FlameNode): void {
    this.host.dataset.frames = String(countNodes(root));
    this.host.dataset.bytes = String(root.value);
    const width = Math.max(this.host.clientWidth, 300);
    if (this.chart && width === this.width) {
      select(this.host).datum(root);
      this.chart.update(root);
      return;
    }
    this.chart?.destroy();
    this.host.replaceChildren();
    this.width = width;
    this.chart = flamegraph<FlameNode>()
      .width(width)
      .cellHeight(18)
      .minFrameSize(2)
      .transitionDuration(0)
      .inverted(true)
      .sort(true)
      .selfValue(false)
      .label((d) => `${d.data.name}${d.data.loc ? ` (${d.data.loc})` : ''}: ${bytes(d.value)}`)
      .setColorMapper((d, original) =>
        d.data.leak > 0 && d.data.leak * 2 >= d.data.value ? leakColor(d.depth) : original,
      )
      .setDetailsElement(this.details);
    select(this.host).datum(root).call(this.chart);
  }
}

function leakColor(depth: number): string {
  return `hsl(0, 70%, ${52 + (depth % 4) * 5}%)`;
}

function countNodes(n: FlameNode): number {
  return 1 + n.children.reduce((sum, c) => sum + countNodes(c), 0);
}
