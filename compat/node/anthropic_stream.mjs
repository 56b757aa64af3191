// The @anthropic-ai/sdk package streaming a message through idemproxy,
// driven by compat_test.go (TestAnthropicNodeStream). It runs the
// scenarios against the sidecar at process.argv[2] and prints one JSON
// line per scenario: the text each call streamed to the application, and
// whether its answer was a replay ("text <content> replayed=<true|false>"),
// or "error <message>".
import Anthropic from '@anthropic-ai/sdk';

const url = new URL(process.argv[2]);
const defaultHeaders = { 'X-Forwarded-User': 'agent-1' };

// The library sends no Idempotency-Key of its own: the application sets
// one per call, and the library sends the same headers on each of its
// retries (timeouts, connection errors, 409, 429 and 5xx, honouring
// Retry-After). retried: a client whose first attempt times out before the
// stream's headers come.
const retried = new Anthropic({ baseURL: url.origin, apiKey: 'sk-ant-compat', maxRetries: 4, timeout: 700, defaultHeaders });
const plain = new Anthropic({ baseURL: url.origin, apiKey: 'sk-ant-compat', maxRetries: 2, defaultHeaders });

async function message(client, prompt, key) {
  try {
    const { data: stream, response } = await client.messages
      .create({ model: 'compat', max_tokens: 64, messages: [{ role: 'user', content: prompt }], stream: true }, { headers: { 'Idempotency-Key': key } })
      .withResponse();
    let text = '';
    for await (const event of stream) {
      if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') text += event.delta.text;
    }
    return `text ${text} replayed=${response.headers.get('idempotent-replayed') === 'true'}`;
  } catch (err) {
    return `error ${err.message}`;
  }
}

function report(scenario, ...calls) {
  console.log(JSON.stringify({ scenario, calls }));
}

report('stream', await message(plain, 'plain', 'msg-plain'));
report('replay', await message(plain, 'plain', 'msg-plain'));
report('retried', await message(retried, 'slow', 'msg-slow'));
