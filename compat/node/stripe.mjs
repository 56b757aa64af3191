// stripe-node through idemproxy, driven by compat_test.go (TestStripeNode).
// It runs the suite's scenarios against the sidecar at process.argv[2] and
// prints one JSON line per scenario: what the library handed the
// application for each call ("charge <id>" or "error <code>").
import Stripe from 'stripe';

const url = new URL(process.argv[2]);
const stripe = new Stripe('sk_test_compat', {
  host: url.hostname,
  port: Number(url.port),
  protocol: 'http',
  maxNetworkRetries: 3,
});
const headers = { 'X-Forwarded-User': 'merchant-1' };

async function charge(key, amount = 100, timeout = undefined) {
  const opts = { idempotencyKey: key, headers };
  if (timeout) opts.timeout = timeout;
  try {
    const ch = await stripe.charges.create({ amount, currency: 'usd' }, opts);
    return ch.id ? `charge ${ch.id}` : `result without id ${JSON.stringify(ch)}`;
  } catch (err) {
    return `error ${err.code || err.type}`;
  }
}

function report(scenario, ...calls) {
  console.log(JSON.stringify({ scenario, calls }));
}

report('plain', await charge('plain-1'));
report('replay', await charge('plain-1'));
report('reused', await charge('plain-1', 999));
report('malformed', await charge('"unterminated'));
report('reset', await charge('reset-1'));
{
  const first = await charge('busy-1');
  report('busy', first, ...(first.startsWith('error') ? [await charge('busy-1')] : []));
}
report('concurrent', ...(await Promise.all([charge('slow-1'), charge('slow-1')])));
report('timeout', await charge('timeout-1', 100, 300));
process.exit(0); // stripe-node's keep-alive sockets would hold the process open
