// @microsoft/fetch-event-source resuming a stream through idemproxy,
// driven by compat_test.go (TestFetchEventSourceResumes). The library is
// written for browsers: in Node it needs window (its timers and fetch)
// and document (it listens for visibilitychange unless openWhenHidden,
// and always removes the listener), which these two lines give it.
globalThis.window = globalThis;
globalThis.document = { hidden: false, addEventListener() {}, removeEventListener() {} };

const { fetchEventSource } = await import('@microsoft/fetch-event-source');

const url = new URL(process.argv[2]);

// events POSTs one generation under key and reads its events; the first
// connection is cut (the application throws) after cutAfter events, and
// the library retries on its own, as it does after a dropped connection:
// the same POST, body and Idempotency-Key, with the Last-Event-ID it
// last saw. It reports every event the application got ("id:data"), and
// each connection's Idempotent-Resumed-After ("-" when absent).
async function events(key, cutAfter) {
  const got = [];
  const resumed = [];
  let cut = false;
  try {
    await fetchEventSource(`${url.origin}/v1/events`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key, 'X-Forwarded-User': 'agent-1' },
      body: JSON.stringify({ prompt: 'count' }),
      openWhenHidden: true,
      async onopen(response) {
        if (!response.ok) throw new Error(`status ${response.status}`);
        resumed.push(response.headers.get('idempotent-resumed-after') ?? '-');
      },
      onmessage(ev) {
        got.push(`${ev.id}:${ev.data}`);
        if (!cut && got.length === cutAfter) {
          cut = true;
          throw new Error('cut');
        }
      },
      onerror(err) {
        if (err.message !== 'cut') throw err; // anything else ends the call
        return 50; // retry after 50 ms
      },
    });
  } catch (err) {
    return [`error ${err.message}`];
  }
  return [got.join(' '), `resumed ${resumed.join(',')}`];
}

function report(scenario, calls) {
  console.log(JSON.stringify({ scenario, calls }));
}

report('cut', await events('events-cut', 3));
report('whole', await events('events-cut', 0));
