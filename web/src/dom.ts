// Building DOM nodes. Every string from the traced program (function names, file paths, command
// lines) reaches the page only as a text node through here: nothing is ever parsed as HTML.

type Child = Node | string | number | null | undefined | false;

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number | boolean | undefined> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    if (k.startsWith('on')) throw new Error('event handlers are attached with addEventListener');
    node.setAttribute(k, v === true ? '' : String(v));
  }
  append(node, ...children);
  return node;
}

export function append(node: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    node.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
  }
}

/// Replaces `node`'s children.
export function fill(node: Node, ...children: Child[]): void {
  while (node.firstChild) node.removeChild(node.firstChild);
  append(node, ...children);
}

export function byId<T extends HTMLElement = HTMLElement>(id: string): T {
  const node = document.getElementById(id);
  if (!node) throw new Error(`#${id} missing from the page`);
  return node as T;
}
