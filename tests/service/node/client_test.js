// client_test.js: an independent Node.js client (@grpc/grpc-js + @grpc/proto-loader, loading
// proto/kdecode/v1/decoder.proto at run time) against `kdecode serve` processes on loopback:
// Generate gives `kdecode run`'s tokens, Health.Check answers, and the same over TLS and
// mutual TLS (certificates made with openssl in a temp dir). Run by node_test.sh, which sets
// KDECODE_BIN, KDECODE_MODEL, KDECODE_PROTO_ROOT (the proto/ directory) and NODE_PATH.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, execFileSync } = require('node:child_process');

function need(name) {
  try {
    return require(name);
  } catch (e) {
    throw new Error(`cannot load ${name} (${e.message}): install the Node test dependencies with deploy/setup.sh ` +
                    '(npm ci --prefix tests/service/node)');
  }
}
const grpc = need('@grpc/grpc-js');
const protoLoader = need('@grpc/proto-loader');

const BIN = process.env.KDECODE_BIN;
const MODEL = process.env.KDECODE_MODEL;
const PROTO_ROOT = process.env.KDECODE_PROTO_ROOT;
const SCALE = Number(process.env.KDECODE_TIME_SCALE || '1');
const TMP = process.env.TEST_TMPDIR || os.tmpdir();
const LOG_DIR = process.env.TEST_UNDECLARED_OUTPUTS_DIR || TMP;
for (const [k, v] of Object.entries({ KDECODE_BIN: BIN, KDECODE_MODEL: MODEL, KDECODE_PROTO_ROOT: PROTO_ROOT })) {
  if (!v) throw new Error(`${k} is not set (run through node_test.sh or bazel test)`);
}
const T = (ms) => ms * SCALE;

const def = protoLoader.loadSync(['kdecode/v1/decoder.proto', 'grpc/health/v1/health.proto'], {
  includeDirs: [PROTO_ROOT], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const pkg = grpc.loadPackageDefinition(def);
const Decoder = pkg.kdecode.v1.Decoder;
const Health = pkg.grpc.health.v1.Health;

// ---------------------------------------------------------------------------------- helpers

const expectedCache = new Map();
function expectedTokens(prompt, maxTokens) {
  const key = `${prompt.join(',')}/${maxTokens}`;
  if (!expectedCache.has(key)) {
    const out = execFileSync(BIN, ['run', '--model', MODEL, '--prompt-ids', prompt.join(','),
      '--max-tokens', String(maxTokens), '--ignore-eos'], { timeout: T(120000), stdio: ['ignore', 'pipe', 'pipe'] });
    expectedCache.set(key, JSON.parse(out.toString()).tokens);
  }
  return expectedCache.get(key);
}

let serverCount = 0;

class Server {
  constructor(name, args, tls) {
    this.name = `node-${name}-${++serverCount}`;
    this.logPath = path.join(LOG_DIR, `server-${this.name}.stderr.log`);
    this.tls = tls || null; // { ca, key, cert } PEM buffers for the client side
    const log = fs.openSync(this.logPath, 'w');
    this.proc = spawn(BIN, ['serve', '--model', MODEL, '--listen', '127.0.0.1:0', ...args],
      { stdio: ['ignore', 'pipe', log] });
    fs.closeSync(log);
    this.exited = new Promise((resolve) => this.proc.on('exit', (code, sig) => resolve({ code, sig })));
    this.clients = [];
  }

  async listening() {
    const line = await new Promise((resolve, reject) => {
      let buf = '';
      const timer = setTimeout(() => reject(new Error(`${this.name}: no listening line\n${this.tail()}`)), T(30000));
      this.proc.stdout.on('data', (d) => {
        buf += d.toString();
        const nl = buf.indexOf('\n');
        if (nl >= 0) {
          clearTimeout(timer);
          resolve(buf.slice(0, nl));
        }
      });
      this.proc.on('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`${this.name}: exited (${code}) before listening\n${this.tail()}`));
      });
    });
    const info = JSON.parse(line);
    assert.ok(info.port > 0, line);
    assert.equal(info.tls, !!this.tls, line);
    this.port = info.port;
    this.target = `127.0.0.1:${info.port}`;
  }

  creds(override) {
    if (override) return override;
    if (!this.tls) return grpc.credentials.createInsecure();
    return grpc.credentials.createSsl(this.tls.ca, this.tls.key || null, this.tls.cert || null);
  }

  // TLS clients verify the DNS name localhost (the certificate also has IP:127.0.0.1).
  options() {
    return this.tls ? { 'grpc.ssl_target_name_override': 'localhost' } : {};
  }

  decoder(creds) {
    const c = new Decoder(this.target, this.creds(creds), this.options());
    this.clients.push(c);
    return c;
  }

  health(creds) {
    const c = new Health(this.target, this.creds(creds), this.options());
    this.clients.push(c);
    return c;
  }

  async waitReady() {
    const h = this.health();
    const deadline = Date.now() + T(60000);
    let last = '';
    while (Date.now() < deadline) {
      try {
        const r = await check(h, 'kdecode.v1.Decoder', T(5000));
        if (r.status === 'SERVING') return;
        last = r.status;
      } catch (e) {
        last = e.message;
      }
      await sleep(50);
    }
    throw new Error(`${this.name}: not SERVING (last: ${last})\n${this.tail()}`);
  }

  tail(lines = 40) {
    let text = '';
    try {
      text = fs.readFileSync(this.logPath, 'utf8');
    } catch (e) {
      return `(no log: ${e.message})`;
    }
    const body = text.split('\n').slice(-lines).join('\n');
    return `---- stderr tail of server ${this.name} (${this.logPath}) ----\n${body}\n---- end ${this.name} ----`;
  }

  async stop() {
    for (const c of this.clients) c.close();
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGTERM');
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), T(20000));
    const { code, sig } = await this.exited;
    clearTimeout(timer);
    return sig ? `signal ${sig}` : code;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function check(health, service, timeoutMs) {
  return new Promise((resolve, reject) => {
    health.Check({ service }, { deadline: Date.now() + (timeoutMs || T(5000)) }, (err, resp) => {
      if (err) reject(err);
      else resolve(resp);
    });
  });
}

// Runs one Generate to its end: { responses, tokens, status }.
function generate(decoder, request, timeoutMs) {
  return new Promise((resolve) => {
    const responses = [];
    let status = null;
    let ended = false;
    const call = decoder.Generate(request, { deadline: Date.now() + (timeoutMs || T(60000)) });
    const done = () => {
      if (status && ended) resolve({ responses, tokens: responses.flatMap((r) => r.token_ids), status });
    };
    call.on('data', (r) => responses.push(r));
    call.on('end', () => { ended = true; done(); });
    call.on('error', () => { ended = true; done(); });
    call.on('status', (s) => { status = s; done(); });
  });
}

function request(prompt, maxTokens, extra) {
  return { prompt_token_ids: prompt, max_tokens: maxTokens, ignore_eos: true, ...extra };
}

async function assertGenerates(decoder, prompt, n, extra) {
  const res = await generate(decoder, request(prompt, n, extra));
  assert.equal(res.status.code, grpc.status.OK, `status ${res.status.code}: ${res.status.details}`);
  assert.deepEqual(res.tokens, expectedTokens(prompt, n));
  const last = res.responses[res.responses.length - 1];
  assert.equal(last.finish_reason, 'FINISH_REASON_LENGTH');
  assert.ok(last.usage, 'the last response carries the usage');
  assert.equal(Number(last.usage.completion_tokens), n);
  assert.equal(Number(last.usage.prompt_tokens), prompt.length);
  for (const r of res.responses.slice(0, -1)) assert.equal(r.finish_reason, 'FINISH_REASON_UNSPECIFIED');
  return res;
}

// Starts a server, runs body(server), prints the server's stderr tail when body fails, and
// checks that the server exits 0 on SIGTERM.
async function withServer(name, args, tls, body) {
  const s = new Server(name, args, tls);
  let failed = null;
  try {
    await s.listening();
    await s.waitReady();
    await body(s);
  } catch (e) {
    failed = e;
  }
  const rc = await s.stop();
  if (!failed && rc !== 0) failed = new Error(`${s.name} did not exit 0 after SIGTERM (${rc})`);
  if (failed) {
    process.stderr.write(`\n${s.tail()}\n`);
    throw failed;
  }
}

function makeCerts() {
  const dir = fs.mkdtempSync(path.join(TMP, 'kdcerts-node-'));
  const ossl = (...args) => execFileSync('/usr/bin/openssl', args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  fs.writeFileSync(path.join(dir, 'ca.cnf'), '[req]\ndistinguished_name = dn\nprompt = no\nx509_extensions = v3\n' +
    '[dn]\nCN = kdecode node test CA\n[v3]\nbasicConstraints = critical, CA:TRUE\n' +
    'keyUsage = critical, keyCertSign, cRLSign\nsubjectKeyIdentifier = hash\n');
  ossl('req', '-x509', '-config', 'ca.cnf', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2');
  const leaf = (name, cn, ext, serial) => {
    fs.writeFileSync(path.join(dir, `${name}.cnf`), `[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = ${cn}\n`);
    fs.writeFileSync(path.join(dir, `${name}.ext`),
      `basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature, keyEncipherment\n${ext}`);
    ossl('req', '-new', '-config', `${name}.cnf`, ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`);
    ossl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-set_serial', String(serial),
      '-days', '2', '-extfile', `${name}.ext`, '-out', `${name}.pem`);
  };
  leaf('server', 'localhost', 'subjectAltName = DNS:localhost, IP:127.0.0.1\nextendedKeyUsage = serverAuth\n', 11);
  leaf('client', 'kdecode node test client', 'extendedKeyUsage = clientAuth\n', 12);
  const read = (f) => fs.readFileSync(path.join(dir, f));
  return { dir, path: (f) => path.join(dir, f), read };
}

// ------------------------------------------------------------------------------------ tests

const PROMPTS = [[1, 2, 3, 4], [10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12], [42]];
const SPEC_OFF = { speculation: { source: 'DRAFT_SOURCE_NONE' } };
const SPEC_NGRAM = { speculation: { num_draft_tokens: 3, source: 'DRAFT_SOURCE_NGRAM' } };

test('plaintext: Generate equals kdecode run; Health.Check', async () => {
  await withServer('plain', [], null, async (s) => {
    const dec = s.decoder();
    for (const p of PROMPTS) {
      await assertGenerates(dec, p, 32, SPEC_OFF);
      await assertGenerates(dec, p, 32, SPEC_NGRAM);
    }
    const streamed = await assertGenerates(dec, [3, 1, 4, 1, 5], 48, { request_id: 'node-1', ...SPEC_OFF });
    assert.ok(streamed.responses.length > 1, 'the tokens came in more than one message');
    assert.equal(streamed.responses[0].request_id, 'node-1');

    const h = s.health();
    assert.equal((await check(h, '')).status, 'SERVING');
    assert.equal((await check(h, 'kdecode.v1.Decoder')).status, 'SERVING');
    await assert.rejects(check(h, 'no.such.Service'), (e) => e.code === grpc.status.NOT_FOUND);

    const bad = await generate(dec, request([], 4));
    assert.equal(bad.status.code, grpc.status.INVALID_ARGUMENT, bad.status.details);
    await assertGenerates(dec, [1, 2, 3], 4);
  });
});

test('TLS: Generate and Health.Check', async () => {
  const certs = makeCerts();
  try {
    await withServer('tls', ['--tls-cert', certs.path('server.pem'), '--tls-key', certs.path('server.key')],
      { ca: certs.read('ca.pem') }, async (s) => {
        const dec = s.decoder();
        await assertGenerates(dec, PROMPTS[0], 24, SPEC_NGRAM);
        await assertGenerates(dec, PROMPTS[1], 24, SPEC_OFF);
        const h = s.health();
        assert.equal((await check(h, '')).status, 'SERVING');
        assert.equal((await check(h, 'kdecode.v1.Decoder')).status, 'SERVING');
        // plaintext against the TLS port fails
        await assert.rejects(check(s.health(grpc.credentials.createInsecure()), '', T(3000)),
          (e) => e.code === grpc.status.UNAVAILABLE || e.code === grpc.status.DEADLINE_EXCEEDED);
      });
  } finally {
    fs.rmSync(certs.dir, { recursive: true, force: true });
  }
});

test('mutual TLS: with the client certificate, and refused without', async () => {
  const certs = makeCerts();
  try {
    const tls = { ca: certs.read('ca.pem'), key: certs.read('client.key'), cert: certs.read('client.pem') };
    await withServer('mtls', ['--tls-cert', certs.path('server.pem'), '--tls-key', certs.path('server.key'),
      '--tls-client-ca', certs.path('ca.pem')], tls, async (s) => {
      await assertGenerates(s.decoder(), PROMPTS[2], 16);
      assert.equal((await check(s.health(), 'kdecode.v1.Decoder')).status, 'SERVING');
      const noCert = grpc.credentials.createSsl(certs.read('ca.pem'));
      await assert.rejects(check(s.health(noCert), '', T(3000)),
        (e) => e.code === grpc.status.UNAVAILABLE || e.code === grpc.status.DEADLINE_EXCEEDED);
    });
  } finally {
    fs.rmSync(certs.dir, { recursive: true, force: true });
  }
});
