// Drives the sale page in headless Chromium against a running stack.
//
// Env: GATEWAY_URL, SALE_ID (a sale that starts a few seconds from now with
// one item), TOKEN_A and TOKEN_B (two buyers), ARTIFACTS (screenshot dir).
// Buyer A opens the page before the start, sees the countdown, waits for the
// start, buys and sees the confirmation with an order id. Buyer B, in a
// second browser context, then sees the sale sold out.
// With EXPECT_POW=1 (the gateway asks a proof of work), buyer A's page must
// have fetched a challenge during the countdown and its buy must carry
// Flashgate-Pow and never meet a 428 (solved before the click).
// With EXPECT_PROTOCOL (e.g. h2), the page must have been loaded over that
// protocol; CHROMIUM_ARGS adds flags (space-separated), e.g. the test CA's
// `--ignore-certificate-errors-spki-list=...` for an HTTPS gateway.
// Exits non-zero, with a screenshot of the failing page, on any failure.
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const need = (k) => { const v = process.env[k]; if (!v) { console.error(`${k} is not set`); process.exit(2); } return v; };
const gateway = need('GATEWAY_URL'), saleId = need('SALE_ID');
const tokenA = need('TOKEN_A'), tokenB = need('TOKEN_B');
const artifacts = process.env.ARTIFACTS || 'target/browser-artifacts';
const expectPow = process.env.EXPECT_POW === '1';
const expectProtocol = process.env.EXPECT_PROTOCOL || '';
const extraArgs = (process.env.CHROMIUM_ARGS || '').split(' ').filter(Boolean);
mkdirSync(artifacts, { recursive: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync', ...extraArgs],
});
const pages = [];
const shot = async (page, name) => { await page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true }); };
const step = (msg) => console.log(`sale.mjs: ${msg}`);

try {
  // A fresh, throwaway profile per buyer.
  const ctxA = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  const a = await ctxA.newPage();
  pages.push(['buyer-a', a]);
  a.on('console', (m) => { if (m.type() === 'error') console.error(`page error: ${m.text()}`); });
  const buys = [];       // [Flashgate-Pow header, status] of buyer A's buy requests
  let challengesFetched = 0;
  a.on('response', async (resp) => {
    const url = new URL(resp.url());
    if (url.pathname.endsWith('/challenge')) challengesFetched++;
    if (url.pathname.endsWith('/buy')) buys.push([(await resp.request().allHeaders())['flashgate-pow'] || '', resp.status()]);
  });
  await a.goto(`${gateway}/flashgate/sales/${saleId}?token=${encodeURIComponent(tokenA)}`);

  await a.locator('#countdown').filter({ hasText: /Starts in \d\d:\d\d/ }).waitFor({ timeout: 10_000 });
  await a.locator('#state', { hasText: 'Starts soon' }).waitFor();
  if (!(await a.locator('#buy').isDisabled())) throw new Error('buy button enabled before the start');
  if (new URL(a.url()).searchParams.has('token')) throw new Error('token left in the address bar');
  step(`countdown shown: ${await a.locator('#countdown').textContent()}`);
  if (expectProtocol) {
    const protocol = await a.evaluate(() => performance.getEntriesByType('navigation')[0].nextHopProtocol);
    if (protocol !== expectProtocol) throw new Error(`page loaded over ${protocol}, not ${expectProtocol}`);
    step(`page loaded over ${protocol}`);
  }
  await shot(a, '1-countdown');

  await a.locator('#buy:enabled').waitFor({ timeout: 60_000 });
  await a.locator('#state', { hasText: 'On sale now' }).waitFor();
  step('sale open, buying');
  await shot(a, '2-open');
  await a.locator('#buy').click();
  await a.locator('#result', { hasText: /Confirmed! Your order: \S+/ }).waitFor({ timeout: 30_000 });
  step(`buyer A: ${await a.locator('#result').textContent()}`);
  await shot(a, '3-confirmed');
  if (expectPow) {
    if (challengesFetched < 1) throw new Error('no challenge fetched before the buy');
    if (buys.length < 1 || buys.some(([pow]) => !/^[A-Za-z0-9_-]{72}\.[0-9]+$/.test(pow))) throw new Error(`buys without Flashgate-Pow: ${JSON.stringify(buys)}`);
    if (buys.some(([, status]) => status === 428)) throw new Error(`the click met a 428: ${JSON.stringify(buys)}`);
    step(`proof of work sent with the buy (${challengesFetched} challenge(s) fetched): ${buys.map(([, s]) => s).join(', ')}`);
  } else if (buys.some(([pow]) => pow)) {
    throw new Error('Flashgate-Pow sent while the gateway asks none');
  }

  const ctxB = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const b = await ctxB.newPage();
  pages.push(['buyer-b', b]);
  await b.goto(`${gateway}/flashgate/sales/${saleId}`);
  await b.locator('#token').fill(tokenB); // B types the token: the field path
  await b.locator('#state', { hasText: 'Sold out' }).waitFor({ timeout: 15_000 });
  await b.locator('#result', { hasText: 'Sold out' }).waitFor();
  if (!(await b.locator('#buy').isDisabled())) throw new Error('buy button enabled on a sold-out sale');
  if ((await b.locator('#remaining').textContent()) !== '0') throw new Error('remaining stock not 0');
  step('buyer B sees sold out');
  await shot(b, '4-sold-out');
  step('all checks passed');
} catch (e) {
  console.error(`sale.mjs: FAILED: ${e.stack || e}`);
  for (const [name, p] of pages) await shot(p, `failure-${name}`).catch(() => {});
  await browser.close();
  process.exit(1);
}
await browser.close();
