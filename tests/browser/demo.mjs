// The demo a newcomer gets from `make run`: opens the sale URL the script
// printed (SALE_URL), which signs in a demo shopper at the demo shop and
// lands on the sale page. The page must look like a product page (photo,
// price, countdown, live stock) and have the shopper's token without any
// pasting (the token field stays hidden); a click on Buy must win.
// Env: SALE_URL, ARTIFACTS (screenshot dir), CHROMIUM.
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const url = process.env.SALE_URL;
if (!url) { console.error('SALE_URL is not set'); process.exit(2); }
const artifacts = process.env.ARTIFACTS || 'target/browser-artifacts/demo';
mkdirSync(artifacts, { recursive: true });
const step = (msg) => console.log(`demo.mjs: ${msg}`);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
const page = await ctx.newPage();
page.on('console', (m) => { if (m.type() === 'error') console.error(`page error: ${m.text()}`); });
try {
  await page.goto(url);
  if (!new URL(page.url()).pathname.startsWith('/flashgate/sales/')) throw new Error(`landed on ${page.url()}, not a sale page`);
  await page.locator('#state', { hasText: 'On sale now' }).waitFor({ timeout: 15_000 });
  await page.locator('#product-image').waitFor({ state: 'visible', timeout: 10_000 });
  const loaded = await page.locator('#product-image').evaluate((img) => img.complete && img.naturalWidth > 0);
  if (!loaded) throw new Error('the product photo did not load');
  const price = (await page.locator('#price').textContent()).trim();
  if (!/\d/.test(price)) throw new Error(`no price shown: "${price}"`);
  await page.locator('#countdown').filter({ hasText: /Ends in \d/ }).waitFor({ timeout: 5_000 });
  const remaining = (await page.locator('#remaining').textContent()).trim();
  if (!/^\d+$/.test(remaining)) throw new Error(`no live stock: "${remaining}"`);
  if (await page.locator('#token-field').isVisible()) throw new Error('the token field is shown: the demo shopper was not signed in');
  step(`product page: ${await page.locator('#name').textContent()}, ${price}, ${remaining} left, ${await page.locator('#countdown').textContent()}`);
  await page.screenshot({ path: join(artifacts, '1-product.png'), fullPage: true });

  const shopper = await page.evaluate(() => {
    const t = document.cookie.split('; ').find((c) => c.startsWith('fg_token='));
    return t ? JSON.parse(atob(t.split('=')[1].split('.')[1].replace(/-/g, '+').replace(/_/g, '/'))).sub : '';
  });
  await page.locator('#buy').click();
  await page.locator('#result', { hasText: /Confirmed! Your order: \S+/ }).waitFor({ timeout: 30_000 });
  step(`won as ${shopper}: ${await page.locator('#result').textContent()}`);
  await page.screenshot({ path: join(artifacts, '2-won.png'), fullPage: true });
} catch (e) {
  console.error(`demo.mjs: FAILED: ${e.stack || e}`);
  await page.screenshot({ path: join(artifacts, 'failure.png'), fullPage: true }).catch(() => {});
  await browser.close();
  process.exit(1);
}
await browser.close();
