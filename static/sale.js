// Sale page: shows the sale's state and remaining stock, and buys with the
// buyer's token and a fresh Idempotency-Key per click.
const saleId = decodeURIComponent(location.pathname.split('/').filter(Boolean)[1] || '');
const $ = (id) => document.getElementById(id);
let offsetMs = 0, sale = null;

async function refresh() {
  const t0 = Date.now();
  const r = await fetch(`/api/sales/${encodeURIComponent(saleId)}`);
  if (!r.ok) { $('state').textContent = 'unknown sale'; return; }
  sale = await r.json();
  offsetMs = Date.parse(sale.server_time) - (t0 + Date.now()) / 2;
  $('name').textContent = sale.name;
  $('state').textContent = sale.state.replace('_', ' ');
  $('remaining').textContent = sale.remaining;
  $('stock').textContent = sale.stock;
}

function tick() {
  if (!sale) return;
  const left = Date.parse(sale.starts_at) - (Date.now() + offsetMs);
  $('countdown').textContent = left > 0 ? `Starts in ${Math.ceil(left / 1000)} s` : '';
}

async function buy() {
  $('buy').disabled = true;
  try {
    const r = await fetch(`/api/sales/${encodeURIComponent(saleId)}/buy`, {
      method: 'POST',
      headers: { 'Authorization': `Bearer ${$('token').value.trim()}`, 'Idempotency-Key': crypto.randomUUID() },
    });
    const body = await r.json();
    if (r.status === 201) $('result').textContent = `Confirmed: order ${body.order_id}`;
    else if (r.status === 202) { $('result').textContent = 'Queued…'; poll(body.reservation_id); }
    else if (r.headers.get('Retry-After')) $('result').textContent = `${body.message}: try again in ${r.headers.get('Retry-After')} s`;
    else $('result').textContent = body.message;
  } finally { $('buy').disabled = false; refresh(); }
}

async function poll(rid) {
  const r = await fetch(`/api/reservations/${encodeURIComponent(rid)}`, { headers: { 'Authorization': `Bearer ${$('token').value.trim()}` } });
  const body = await r.json();
  if (body.status === 'confirmed') $('result').textContent = `Confirmed: order ${body.order_id}`;
  else if (body.status === 'cancelled') $('result').textContent = 'Cancelled';
  else setTimeout(() => poll(rid), 1000);
}

$('buy').addEventListener('click', buy);
refresh(); setInterval(refresh, 2000); setInterval(tick, 250);
