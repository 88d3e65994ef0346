// The Node half of benchmarks/bench_typescript.py, which compiles the generated
// TypeScript and runs this file; not meant to be run by hand.
//
//   node bench_typescript.mjs apply MODULE ROUNDS
//     the compiled job module's apply(state, event) beside a plain object lookup
//     (`plain[state][event]`, seed 002's hand-written table), interleaved round by
//     round; prints one JSON line: [[apply ns, lookup ns], ...] per call.
//   node bench_typescript.mjs worker MODULE DSN SCHEMA
//     one worker draining the queue (claim, start, finish: three autocommit round
//     trips a job); prints one JSON line: {"jobs": n, "seconds": s}.

import { pathToFileURL } from "node:url";

const [mode, modulePath, ...rest] = process.argv.slice(2);
const job = await import(pathToFileURL(modulePath).href);

if (mode === "apply") {
  const rounds = Number(rest[0]);
  // The same table as a plain object, as a hand-written worker keeps it.
  const plain = {};
  for (const state of Object.values(job.State)) {
    plain[state] = {};
    for (const event of Object.values(job.Event)) {
      const target = job.TRANSITIONS[state]?.[event];
      if (target !== undefined) {
        plain[state][event] = target;
      }
    }
  }
  // Every legal pair, in a fixed shuffled order (the same work for both).
  const pairs = Object.entries(plain).flatMap(([s, row]) => Object.keys(row).map((e) => [s, e]));
  const work = [];
  for (let i = 0; i < 4096; i += 1) {
    work.push(pairs[(i * 7919) % pairs.length]);
  }
  const states = work.map((p) => p[0]);
  const events = work.map((p) => p[1]);
  const repeat = 200;
  const calls = repeat * work.length;

  function viaApply() {
    let hits = 0;
    for (let r = 0; r < repeat; r += 1) {
      for (let i = 0; i < states.length; i += 1) {
        if (job.apply(states[i], events[i]) !== undefined) hits += 1;
      }
    }
    return hits;
  }

  function viaLookup() {
    let hits = 0;
    for (let r = 0; r < repeat; r += 1) {
      for (let i = 0; i < states.length; i += 1) {
        if (plain[states[i]][events[i]] !== undefined) hits += 1;
      }
    }
    return hits;
  }

  function timed(f) {
    const start = process.hrtime.bigint();
    if (f() !== calls) throw new Error("a legal pair was refused");
    return Number(process.hrtime.bigint() - start) / calls;
  }

  for (let i = 0; i < 5; i += 1) { // warm up: both compiled by the optimising tier
    timed(viaApply);
    timed(viaLookup);
  }
  const out = [];
  for (let i = 0; i < rounds; i += 1) {
    if (i % 2 === 0) { // each first in every other round
      const a = timed(viaApply);
      out.push([a, timed(viaLookup)]);
    } else {
      const b = timed(viaLookup);
      out.push([timed(viaApply), b]);
    }
  }
  console.log(JSON.stringify(out));
} else if (mode === "worker") {
  const [dsn, schema] = rest;
  const pg = (await import("pg")).default;
  const client = new pg.Client({ connectionString: dsn });
  await client.connect();
  const start = process.hrtime.bigint();
  let jobs = 0;
  for (;;) {
    const [row] = await job.claim(client, "claim", { actor: "node", schema });
    if (row === undefined) break;
    const version = await job.transition(client, row.id, "start", { expectedVersion: row.version, actor: "node", schema });
    await job.transition(client, row.id, "finish", { expectedVersion: version, actor: "node", schema });
    jobs += 1;
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  await client.end();
  console.log(JSON.stringify({ jobs, seconds }));
} else {
  throw new Error(`unknown mode ${mode}`);
}
