// Drives the explorer page in Debian's Chromium (headless) against a live leaktracer that traces
// a leaking program, and checks what a user would look for. Run by tests/it/explorer.rs:
//
//   node tests/explorer.mjs URL SHOTS_DIR EXPECT_JSON
//
// EXPECT_JSON: {"function": "activations", "site": "activations (patterns.c:12)",
//               "hostile": "<img src=x onerror=alert(1)>"}
// Exits 0 when every check passed, 1 with the failed check on stderr. Screenshots of each stage
// are written to SHOTS_DIR.
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [url, shots, expectJson] = process.argv.slice(2);
if (!url || !shots || !expectJson) {
  console.error('usage: node tests/explorer.mjs URL SHOTS_DIR EXPECT_JSON');
  process.exit(2);
}
const expect = JSON.parse(expectJson);
const STEP_TIMEOUT = 60_000;

const profile = mkdtempSync(join(tmpdir(), 'leaktracer-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1400, height: 1000 },
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
  ],
});
const page = context.pages()[0] ?? (await context.newPage());
const dialogs = [];
const pageErrors = [];
page.on('dialog', (d) => {
  dialogs.push(d.message());
  void d.dismiss();
});
page.on('pageerror', (e) => pageErrors.push(String(e)));
// Any request for the hostile image (src=x) would mean markup was built from a string.
const strayRequests = [];
page.on('request', (r) => {
  if (!r.url().startsWith(url)) strayRequests.push(r.url());
  if (/\/x$/.test(new URL(r.url()).pathname)) strayRequests.push(r.url());
});

let stage = 'start';
function check(cond, what) {
  if (!cond) throw new Error(`${stage}: ${what}`);
  console.log(`ok ${stage}: ${what}`);
}

try {
  stage = 'load';
  const t0 = Date.now();
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForSelector('#stacks tbody tr[data-id]', { timeout: STEP_TIMEOUT });
  console.log(`page load to first table: ${Date.now() - t0} ms`);

  stage = 'live';
  const updates = async () => Number((await page.getAttribute('#conn', 'data-updates')) ?? 0);
  await page.waitForFunction(() => Number(document.querySelector('#conn')?.dataset.updates ?? 0) >= 1, null, {
    timeout: STEP_TIMEOUT,
  });
  const first = await updates();
  const elapsedBefore = await page.textContent('#status');
  await page.waitForFunction(
    (n) => Number(document.querySelector('#conn')?.dataset.updates ?? 0) >= n + 2,
    first,
    { timeout: STEP_TIMEOUT },
  );
  check((await updates()) >= first + 2, 'live updates arrive without reloading');
  check((await page.textContent('#status')) !== elapsedBefore, 'the status line moves with them');
  check((await page.textContent('#conn')) === 'live', 'the connection says live');

  stage = 'table';
  const leakRow = `#stacks tbody tr.leak:has(td.site:text-is("${expect.site.replace(/"/g, '\\"')}"))`;
  await page.waitForSelector(leakRow, { timeout: STEP_TIMEOUT });
  check(true, `the leak at ${expect.site} is in the table, judged a leak`);
  await page.screenshot({ path: join(shots, '1-live.png'), fullPage: true });

  stage = 'sort and filter';
  await page.fill('#filter-text', expect.function);
  const shown = await page.$$eval('#stacks tbody td.site', (tds) => tds.map((td) => td.textContent));
  check(shown.length > 0 && shown.every((s) => s.includes(expect.function)), `filtering by "${expect.function}" keeps only its rows`);
  await page.fill('#filter-text', '');
  await page.click('#stacks th[data-key="bytes"]');
  const bytesAsc = await page.$$eval('#stacks tbody tr[data-id]', (trs) => trs.length);
  check(bytesAsc > 1, 'sorting by bytes keeps every row');
  await page.click('#stacks th[data-key="verdict"]');
  await page.click('#stacks th[data-key="verdict"]');
  const firstVerdict = await page.textContent('#stacks tbody tr[data-id] td .verdict');
  check(firstVerdict === 'leak', `sorted by verdict, leaks come first (got ${firstVerdict})`);

  stage = 'timeline';
  await page.waitForFunction(() => Number(document.querySelector('#timeline')?.dataset.points ?? 0) >= 3, null, {
    timeout: STEP_TIMEOUT,
  });
  const inked = await page.$eval('#timeline canvas', (c) => {
    const ctx = c.getContext('2d');
    const { data } = ctx.getImageData(0, 0, c.width, c.height);
    let n = 0;
    for (let i = 3; i < data.length; i += 4) if (data[i] > 0) n++;
    return n;
  });
  check(inked > 500, `the timeline chart draws its points (${inked} pixels inked)`);

  stage = 'flamegraph';
  await page.selectOption('#flame-kind', 'heap');
  await page.waitForSelector(`#flame svg g[name="${expect.function}"]`, { timeout: STEP_TIMEOUT });
  check(true, `the flamegraph holds the frame ${expect.function}`);
  const fill = await page.$eval(`#flame svg g[name="${expect.function}"] rect`, (r) => r.getAttribute('fill'));
  check(/^hsl\(0,/.test(fill ?? ''), `the leaking frame is drawn red (${fill})`);

  stage = 'stack detail';
  await page.click(leakRow);
  await page.waitForSelector('#stack ol.frames li.innermost', { timeout: STEP_TIMEOUT });
  const innermost = await page.textContent('#stack ol.frames li.innermost .fn');
  check(innermost === expect.function, `the stack's innermost frame is ${expect.function} (got ${innermost})`);
  const loc = await page.textContent('#stack ol.frames li.innermost .loc');
  check(loc?.endsWith(expect.site.match(/\((.*)\)/)[1]), `with its file:line (${loc})`);
  await page.waitForFunction(() => Number(document.querySelector('#stack-chart')?.dataset.points ?? 0) >= 2, null, {
    timeout: STEP_TIMEOUT,
  });
  check(true, "the stack's series is drawn");
  await page.screenshot({ path: join(shots, '2-detail.png'), fullPage: true });

  stage = 'hostile strings';
  const body = await page.textContent('body');
  check(body.includes(expect.hostile), 'the hostile file path and command line are shown as text');
  check((await page.$$('img')).length === 0, 'no <img> element was created from them');
  check(dialogs.length === 0, `no script ran (dialogs: ${JSON.stringify(dialogs)})`);

  stage = 'diff';
  await page.waitForFunction(() => document.querySelector('#status')?.textContent?.startsWith('ended'), null, {
    timeout: 120_000,
  });
  await page.waitForFunction(() => (document.querySelector('#diff-new')?.options.length ?? 0) >= 2, null, {
    timeout: STEP_TIMEOUT,
  });
  await page.click('#diff-go');
  await page.waitForSelector('#diff tbody tr', { timeout: STEP_TIMEOUT });
  const grew = await page.$$eval('#diff tbody tr', (trs) =>
    trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent)),
  );
  const row = grew.find((cells) => cells[2].startsWith(expect.function));
  check(row && (row[0] === 'grew' || row[0] === 'new') && row[5].startsWith('+'), `the diff shows ${expect.function} grew (${JSON.stringify(row)})`);
  await page.screenshot({ path: join(shots, '3-ended-diff.png'), fullPage: true });

  stage = 'left out';
  // Ended (the figures hold still): the page's table holds every stack the report lists, and
  // the line under it that counts what is left out (past --top, past the page's 500) says
  // nothing where nothing is (the API is unit-tested with stacks left out).
  const health = await page.evaluate(async () => (await fetch(`api/v1/health${location.search}`)).json());
  const rows = await page.$$eval('#stacks tbody tr[data-id]', (trs) => trs.length);
  check(rows === health.stacks_listed, `the table shows the ${health.stacks_listed} stacks the report lists (got ${rows})`);
  check(health.unlisted.stacks === 0, `the report leaves none of this program's stacks out (${health.unlisted.stacks})`);
  check(!(await page.isVisible('#stacks-left-out')), 'so the page says nothing left out');

  stage = 'end';
  check(pageErrors.length === 0, `no script errors on the page (${pageErrors.join('; ')})`);
  check(strayRequests.length === 0, `no request left the explorer (${strayRequests.join(', ')})`);
  check((await page.$$('img')).length === 0 && dialogs.length === 0, 'still nothing executed');
} catch (e) {
  console.error(`FAILED ${e.message}`);
  await page.screenshot({ path: join(shots, 'failure.png'), fullPage: true }).catch(() => {});
  await context.close();
  rmSync(profile, { recursive: true, force: true });
  process.exit(1);
}
await context.close();
rmSync(profile, { recursive: true, force: true });
