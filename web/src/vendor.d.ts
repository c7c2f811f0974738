// The parts of d3-flame-graph's API the page uses (the package ships no types).
declare module 'd3-flame-graph' {
  export interface FlameDatum<T> {
    data: T;
    value: number;
    depth: number;
  }
  export interface FlameGraph<T> {
    (selection: unknown): void;
    width(w: number): FlameGraph<T>;
    cellHeight(h: number): FlameGraph<T>;
    minFrameSize(px: number): FlameGraph<T>;
    transitionDuration(ms: number): FlameGraph<T>;
    inverted(on: boolean): FlameGraph<T>;
    selfValue(on: boolean): FlameGraph<T>;
    sort(on: boolean): FlameGraph<T>;
    label(f: (d: FlameDatum<T>) => string): FlameGraph<T>;
    setColorMapper(f: (d: FlameDatum<T>, original: string) => string): FlameGraph<T>;
    setDetailsElement(el: HTMLElement | null): FlameGraph<T>;
    onClick(f: (d: FlameDatum<T>) => void): FlameGraph<T>;
    update(data?: T): void;
    resetZoom(): void;
    destroy(): void;
  }
  export default function flamegraph<T>(): FlameGraph<T>;
}
declare module '*.css';
