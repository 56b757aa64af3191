// The openai npm package streaming a chat completion through idemproxy,
// driven by compat_test.go (TestOpenAINodeStream). It runs the scenarios
// against the sidecar at process.argv[2] and prints one JSON line per
// scenario: the text each call streamed to the application, and whether
// its answer was a replay ("text <content> replayed=<true|false>"), or
// "error <message>".
import OpenAI from 'openai';

const url = new URL(process.argv[2]);
const headers = { 'X-Forwarded-User': 'agent-1' };

// The library sends no Idempotency-Key of its own: the application sets
// one per call, and the library sends the same headers on each of its
// retries. retried: a client whose first attempt times out before the
// stream's headers come; the library retries (honouring 409's
// Retry-After) under the same key.
const retried = new OpenAI({ baseURL: `${url.origin}/v1`, apiKey: 'sk-compat', maxRetries: 4, timeout: 700, defaultHeaders: headers });
const plain = new OpenAI({ baseURL: `${url.origin}/v1`, apiKey: 'sk-compat', maxRetries: 2, defaultHeaders: headers });

async function chat(client, prompt, key, onFirst = () => {}) {
  const opts = { headers: { 'Idempotency-Key': key } };
  try {
    const { data: stream, response } = await client.chat.completions
      .create({ model: 'compat', messages: [{ role: 'user', content: prompt }], stream: true }, opts)
      .withResponse();
    let text = '';
    for await (const chunk of stream) {
      if (text === '') await onFirst();
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    return `text ${text} replayed=${response.headers.get('idempotent-replayed') === 'true'}`;
  } catch (err) {
    return `error ${err.message}`;
  }
}

function report(scenario, ...calls) {
  console.log(JSON.stringify({ scenario, calls }));
}

report('stream', await chat(plain, 'plain', 'chat-plain'));
report('replay', await chat(plain, 'plain', 'chat-plain'));
report('retried', await chat(retried, 'slow', 'chat-slow'));
report('attached', ...(await Promise.all([
  // The upstream holds the rest of this stream until the application has
  // its first chunk (a pass-through GET tells it): buffered, it never would.
  chat(plain, 'long', 'chat-long', () => fetch(`${url.origin}/release`, { headers }).then((r) => r.text())),
  new Promise((r) => setTimeout(r, 300)).then(() => chat(plain, 'long', 'chat-long')),
])));
