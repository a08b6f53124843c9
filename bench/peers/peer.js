#!/usr/bin/env node
// Drives one peer queue (Graphile Worker or pg-boss) through one benchmark measure and prints
// exactly one JSON line on stdout. Everything else goes to stderr. See README.md.
'use strict'

const { EventEmitter, once } = require('events')
const { performance } = require('perf_hooks')
const pg = require('pg')

const USAGE = `usage: PEER_DATABASE_URL=postgres://user:pw@host:port/db node peer.js <graphile|pgboss> <drain|pickup|idle>
  [--url URL (else PEER_DATABASE_URL, which keeps a password out of the process list)] [--workers N] [--jobs J] [--mode single|batched] [--task noop|exec] [--samples S] [--max-gap-ms G] [--window-secs W] [--timeout-secs T]`

// stdout carries only the result line: anything a library prints with console.log goes to stderr.
const writeResult = (obj) => process.stdout.write(JSON.stringify(obj) + '\n', () => process.exit(0))
console.log = console.info = console.error
const log = (msg) => console.error(`[peer] ${msg}`)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// ESM packages export no package.json: read it from node_modules.
const versionOf = (name) => JSON.parse(require('fs').readFileSync(require('path').join(__dirname, 'node_modules', name, 'package.json'), 'utf8')).version

const TASK = 'noop' // graphile task identifier and pg-boss queue name
const INSERT_CHUNK = 1000 // jobs per bulk-insert call while pre-filling (not timed)
const BATCH = 16 // our queue claims up to 16 jobs per statement

const usageError = (msg) => Object.assign(new Error(`${msg}\n${USAGE}`), { usage: true })

function parseArgs (argv) {
  const [peer, measure, ...rest] = argv
  const opts = { url: process.env.PEER_DATABASE_URL, workers: 8, jobs: 2000, mode: 'single', task: 'noop', samples: undefined, maxGapMs: 30, windowSecs: 120, timeoutSecs: 900 }
  const names = { '--url': 'url', '--workers': 'workers', '--jobs': 'jobs', '--mode': 'mode', '--task': 'task', '--samples': 'samples', '--max-gap-ms': 'maxGapMs', '--window-secs': 'windowSecs', '--timeout-secs': 'timeoutSecs' }
  for (let i = 0; i < rest.length; i += 2) {
    const key = names[rest[i]]
    if (!key || rest[i + 1] === undefined) throw usageError(`bad argument ${rest[i]}`)
    opts[key] = ['url', 'mode', 'task'].includes(key) ? rest[i + 1] : Number(rest[i + 1])
    if (typeof opts[key] === 'number' && !(Number.isInteger(opts[key]) && opts[key] > 0)) throw usageError(`${rest[i]} needs a positive integer`)
  }
  if (!Object.hasOwn(PEERS, peer) || !Object.hasOwn(MEASURES, measure) || !opts.url) throw usageError('missing or unknown peer, measure, or no --url / PEER_DATABASE_URL')
  if (!['single', 'batched'].includes(opts.mode)) throw usageError('--mode must be single or batched')
  if (!['noop', 'exec'].includes(opts.task)) throw usageError('--task must be noop or exec')
  if (opts.task === 'exec' && peer !== 'graphile') throw usageError('--task exec is for graphile')
  return { peer, measure, opts }
}

// ---------------------------------------------------------------- Graphile Worker
const graphile = (() => {
  const gw = require('graphile-worker')
  const logger = new gw.Logger(() => (level, message) => { if (level === 'error') console.error(`[graphile] ${message}`) })
  return {
    version: versionOf('graphile-worker'),
    // Completed jobs are deleted, so "drained" means the jobs table is empty.
    pendingSql: 'select exists (select 1 from graphile_worker._private_jobs) as pending',

    async prepareDrain (url, { workers, jobs, mode }, task) {
      await gw.runMigrations({ connectionString: url, logger })
      const utils = await gw.makeWorkerUtils({ connectionString: url, logger })
      for (let i = 0; i < jobs; i += INSERT_CHUNK) {
        await utils.addJobs(Array.from({ length: Math.min(INSERT_CHUNK, jobs - i) }, () => ({ identifier: TASK, payload: {} })))
      }
      await utils.release()
      const worker = { connectionString: url, concurrentJobs: workers, maxPoolSize: workers }
      let config = `run({concurrentJobs:${workers}, maxPoolSize:${workers} (its LISTEN connection included), pollInterval:2000 default, `
      if (mode === 'batched') {
        // Release notes recommend localQueue.size = concurrency + 1, and the worker warns when it is
        // below concurrency; we keep it at least our own claim size.
        const size = Math.max(BATCH, workers + 1)
        Object.assign(worker, { localQueue: { size }, completeJobBatchDelay: 0, failJobBatchDelay: 0 })
        config += `localQueue:{size:${size}} (max(16, concurrency+1)), completeJobBatchDelay:0, failJobBatchDelay:0})`
      } else {
        config += 'no localQueue, completeJobBatchDelay/failJobBatchDelay:-1 default (one job per fetch, one completion per job)})'
      }
      let runner
      return {
        config,
        connections: workers,
        start: async () => { runner = await gw.run({ noHandleSignals: true, logger, taskList: { [TASK]: task }, preset: { worker } }) },
        stop: () => runner.stop()
      }
    },

    async startDefault (url, task) {
      const events = new EventEmitter()
      const listening = once(events, 'pool:listen:success')
      const runner = await gw.run({ connectionString: url, noHandleSignals: true, logger, events, taskList: { [TASK]: task } })
      await listening
      return {
        config: 'run({connectionString}) defaults: concurrentJobs:1, maxPoolSize:10, pollInterval:2000, LISTEN "jobs:insert"; jobs added with runner.addJob',
        connections: 10,
        add: () => runner.addJob(TASK, {}),
        stop: () => runner.stop()
      }
    }
  }
})()

// ---------------------------------------------------------------- pg-boss
const pgboss = (() => {
  const { PgBoss } = require('pg-boss')
  const POLL_S = 0.5 // the smallest pollingIntervalSeconds pg-boss 12 accepts
  // Its stats cache, which burstWhenReadyExceeds reads, refreshed every second (default 60 s).
  const CACHE = { monitorIntervalSeconds: 1, queueCacheIntervalSeconds: 1, superviseIntervalSeconds: 1 }
  async function open (config) {
    const boss = new PgBoss(config)
    boss.on('error', (e) => console.error(`[pg-boss] ${e.message}`))
    await boss.start() // installs the schema and starts its maintenance and cron workers
    await boss.createQueue(TASK) // pg-boss 10+ works only on queues created first
    return {
      boss,
      // stop() resolves before the graceful shutdown ends; 'stopped' follows once the pool is closed.
      stop: async () => { const stopped = once(boss, 'stopped'); await boss.stop({ destroy: true }); await stopped }
    }
  }
  return {
    version: versionOf('pg-boss'),
    pendingSql: `select exists (select 1 from pgboss.job where name = '${TASK}' and state < 'completed') as pending`,

    async prepareDrain (url, { workers, jobs, mode }, task) {
      const { boss, stop } = await open({ connectionString: url, max: workers, ...CACHE })
      for (let i = 0; i < jobs; i += INSERT_CHUNK) {
        await boss.insert(TASK, Array.from({ length: Math.min(INSERT_CHUNK, jobs - i) }, () => ({ data: {} })))
      }
      // A worker waits out its polling interval after a fetch unless a burst trigger holds: a full
      // batch (batched), or a cached backlog of at least one job (one job per fetch).
      const options = mode === 'batched'
        ? { batchSize: BATCH, localConcurrency: workers, pollingIntervalSeconds: POLL_S, burstWhenBatchFull: true }
        : { batchSize: 1, localConcurrency: workers, pollingIntervalSeconds: POLL_S, burstWhenReadyExceeds: 1 }
      return {
        config: `new PgBoss({max:${workers}, monitor/queueCache/supervise every 1 s}) + work('${TASK}', ${JSON.stringify(options).replace(/"/g, '')}); pool shared with its maintenance workers`,
        connections: workers,
        start: async () => { await boss.work(TASK, options, task) },
        stop
      }
    },

    async startDefault (url, task) {
      const { boss, stop } = await open(url)
      await boss.work(TASK, task)
      return {
        config: 'new PgBoss(url) defaults: pool max 10, work() batchSize:1, pollingIntervalSeconds:2, useListenNotify:false (polling only); jobs added with boss.send',
        connections: 10,
        add: () => boss.send(TASK, {}),
        stop
      }
    }
  }
})()

const PEERS = { graphile, pgboss }

// ---------------------------------------------------------------- measures
// CPU (user + system, ms) of every process named postgres on this machine, from /proc.
function postgresCpuMs () {
  const fs = require('fs')
  const tck = 100 // USER_HZ on Linux
  let ms = 0
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
      const comm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'))
      const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      if (comm === 'postgres') ms += ((Number(rest[11]) + Number(rest[12])) * 1000) / tck
    } catch { /* the process ended */ }
  }
  return ms
}

// The database's statements by total execution time (pg_stat_statements lives in "postgres").
async function statementTotals (url) {
  const statsUrl = new URL(url)
  const dbName = statsUrl.pathname.slice(1)
  statsUrl.pathname = '/postgres'
  const c = new pg.Client(statsUrl.toString())
  await c.connect()
  const { rows } = await c.query(`select queryid::text as id, calls::bigint as calls, total_exec_time as ms,
      left(btrim(regexp_replace(query, '\\s+', ' ', 'g')), 70) as query
      from pg_stat_statements where dbid = (select oid from pg_database where datname = $1)`, [dbName])
  await c.end()
  return new Map(rows.map((r) => [r.id, { calls: Number(r.calls), ms: r.ms, query: r.query }]))
}

async function drain (peer, opts) {
  let handled = 0
  // pg-boss 10+ hands its handler an array of jobs, in both modes. The exec task runs a process
  // per job, as an agent would: `/bin/true` through child_process.execFile, awaited.
  const execFile = require('util').promisify(require('child_process').execFile)
  const task = peer === pgboss
    ? async (jobs) => { handled += jobs.length }
    : opts.task === 'exec'
      ? async () => { await execFile('/bin/true'); handled++ }
      : async () => { handled++ }
  const run = await peer.prepareDrain(opts.url, opts, task)
  const client = new pg.Client(opts.url)
  await client.connect()
  log(`drain: ${opts.jobs} jobs queued; starting workers`)
  const stmts0 = await statementTotals(opts.url)
  const cpu0 = postgresCpuMs()
  const t0 = performance.now()
  await run.start()
  for (;;) {
    const polled = performance.now()
    if (!(await client.query(peer.pendingSql)).rows[0].pending) break
    await sleep(Math.max(0, 10 - (performance.now() - polled)))
  }
  const secs = (performance.now() - t0) / 1000
  const cpu = postgresCpuMs() - cpu0
  await client.end()
  await run.stop()
  if (handled !== opts.jobs) throw new Error(`handler ran ${handled} times for ${opts.jobs} jobs`)
  // What the drain cost the database: its statements (our 10 ms completion check included,
  // as the Rust side's is in ours) and PostgreSQL's CPU while it ran.
  const top = [...(await statementTotals(opts.url)).entries()]
    .map(([id, s]) => ({ calls: s.calls - (stmts0.get(id)?.calls ?? 0), total_ms: round(s.ms - (stmts0.get(id)?.ms ?? 0), 1), query: s.query }))
    .filter((s) => s.calls > 0)
    .sort((a, b) => b.total_ms - a.total_ms)
  const statements = top.reduce((n, s) => n + s.calls, 0)
  return {
    mode: opts.mode, task: opts.task === 'exec' ? "execFile('/bin/true')" : 'no-op', workers: opts.workers, jobs: opts.jobs, secs: round(secs, 3), jobs_per_s: round(opts.jobs / secs, 1), handled,
    postgres_cpu_ms_per_1k_jobs: round((cpu / opts.jobs) * 1000, 1), statements_per_job: round(statements / opts.jobs, 3),
    top: top.slice(0, 6), connections: run.connections, config: run.config
  }
}

async function pickup (peer, opts) {
  const samples = opts.samples ?? (peer === pgboss ? 20 : 200) // pg-boss polls every 2 s by default
  let started
  const run = await peer.startDefault(opts.url, async () => { started(performance.now()) })
  await sleep(1000) // let startup queries finish
  const maxGap = Math.max(opts.maxGapMs, 5)
  const lat = []
  for (let i = 0; i < samples; i++) {
    // The gap starts right after the previous pickup, i.e. right after a poller's fetch: with 5-30 ms
    // a polling peer sees every job near the end of its interval; --max-gap-ms <interval> spreads them.
    await sleep(5 + Math.random() * (maxGap - 5))
    const handlerStart = new Promise((resolve) => { started = resolve })
    const t0 = performance.now()
    await run.add()
    lat.push((await handlerStart) - t0)
  }
  await run.stop()
  lat.sort((a, b) => a - b)
  const pct = (p) => round(lat[Math.ceil((p / 100) * lat.length) - 1], 2)
  return { samples, gap_ms: [5, maxGap], p50_ms: pct(50), p95_ms: pct(95), p99_ms: pct(99), max_ms: round(lat[lat.length - 1], 2), connections: run.connections, config: run.config }
}

async function idle (peer, opts) {
  // pg_stat_statements lives in the cluster's "postgres" database (the fresh bench database has no
  // extension), so the reads run there, filtered on the bench database's oid.
  const dbName = new URL(opts.url).pathname.slice(1)
  const statsUrl = new URL(opts.url)
  statsUrl.pathname = '/postgres'
  const client = new pg.Client(statsUrl.toString())
  await client.connect()
  const readSql = `select (select xact_commit from pg_stat_database where datname = $1)::bigint as xact,
      coalesce((select json_agg(json_build_object('id', queryid::text, 'calls', calls, 'query', left(btrim(regexp_replace(query, '\\s+', ' ', 'g')), 70)))
                from pg_stat_statements where dbid = (select oid from pg_database where datname = $1)), '[]') as stmts`
  const read = async () => {
    const { xact, stmts } = (await client.query(readSql, [dbName])).rows[0]
    return { xact: Number(xact), stmts: new Map(stmts.map((s) => [s.id, s])) }
  }
  const diff = (a, b) => [...b.stmts.values()].map((s) => ({ ...s, calls: s.calls - (a.stmts.get(s.id)?.calls ?? 0) })).filter((s) => s.calls > 0)
  // What one read adds to the counted statements (0 while reads go through another database).
  const c0 = await read()
  const overhead = diff(c0, await read())

  const run = await peer.startDefault(opts.url, async () => {})
  // 5 s to settle, plus PostgreSQL 15's up to 10 s delay before an idle backend reports its
  // transaction counts: else the setup's commits land in the window.
  await sleep(15000)
  const before = await read()
  log(`idle: counting statements for ${opts.windowSecs} s`)
  await sleep(opts.windowSecs * 1000)
  const after = await read()
  await run.stop()
  await client.end()

  const seen = new Map(diff(before, after).map((s) => [s.id, s]))
  for (const o of overhead) if (seen.has(o.id)) seen.get(o.id).calls -= o.calls
  const stmts = [...seen.values()].filter((s) => s.calls > 0).sort((a, b) => b.calls - a.calls)
  const statements = stmts.reduce((n, s) => n + s.calls, 0)
  const xact = after.xact - before.xact
  const perMin = (n) => round((n * 60) / opts.windowSecs, 1)
  return {
    window_secs: opts.windowSecs,
    statements,
    statements_per_min: perMin(statements),
    xact_commits: xact,
    xact_per_min: perMin(xact),
    read_overhead_calls: overhead.reduce((n, s) => n + s.calls, 0),
    top: stmts.slice(0, 10).map(({ calls, query }) => ({ calls, query })),
    connections: run.connections,
    config: run.config
  }
}

const MEASURES = { drain, pickup, idle }
const round = (x, digits) => Number(x.toFixed(digits))

async function main () {
  const { peer, measure, opts } = parseArgs(process.argv.slice(2))
  setTimeout(() => fail(new Error(`timed out after ${opts.timeoutSecs} s`)), opts.timeoutSecs * 1000).unref()
  const result = await MEASURES[measure](PEERS[peer], opts)
  writeResult({ peer, measure, ...result, version: PEERS[peer].version })
}

function fail (err) {
  console.error(`peer.js: ${err.usage || !err.stack ? err.message || err : err.stack}`)
  process.exit(1)
}
process.on('unhandledRejection', fail)
main().catch(fail)
