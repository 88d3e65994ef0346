// Parse many Mermaid diagrams with real Mermaid, in one Node process.
//
// Usage:  node parse.mjs FILE...            (each file is one diagram)
//         node parse.mjs < texts.json       (stdin: a JSON array of diagram texts)
//         node parse.mjs --serve            (stdin: one JSON array a line, answered
//                                            by one line each, until stdin closes)
//
// --serve keeps one process for a whole test run (tests/mermaid_check.py): loading
// jsdom and Mermaid takes about two seconds of CPU, parsing a diagram milliseconds.
//
// Prints one JSON array to stdout, one entry per diagram, in input order:
//   {"ok": true,  "type": "stateDiagram", "length": 1234,
//    "nodes": [{"id": "a", "label": "a", "shape": "rect"}, ...],
//    "edges": [{"start": "a", "end": "b", "label": "go"}, ...]}
//   {"ok": false, "error": "Parse error on line 3: ..."}
// `type` is what `mermaid.parse` reports; `nodes` and `edges` are the layout data
// the state-diagram renderer draws (labels as they would be shown), present for
// state diagrams only. Exit status 0 whenever the report was written, even if
// diagrams failed to parse; 2 for bad usage.
//
// Mermaid needs a DOM to load: window/document come from jsdom, set before the
// import. Rendering itself needs SVG text measurement, which jsdom lacks, so this
// checks parsing (what viewers run first) and the data the renderer is given.

import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { JSDOM } from "jsdom";

const dom = new JSDOM("<!DOCTYPE html><html><body></body></html>", { pretendToBeVisual: true });
globalThis.window = dom.window;
globalThis.document = dom.window.document;

const { default: mermaid } = await import("mermaid");
mermaid.initialize({ startOnLoad: false }); // default configuration otherwise

function readInputs(args) {
    if (args.length > 0) {
        return args.map((path) => readFileSync(path, "utf8"));
    }
    return asTexts(JSON.parse(readFileSync(0, "utf8")));
}

function stateData(diagram) {
    const data = diagram.db.getData();
    return {
        nodes: data.nodes.map((n) => ({ id: n.id, label: n.label, shape: n.shape })),
        edges: data.edges.map((e) => ({ start: e.start, end: e.end, label: e.label })),
    };
}

async function check(text) {
    try {
        const { diagramType } = await mermaid.parse(text);
        const result = { ok: true, type: diagramType, length: text.length };
        if (diagramType.startsWith("stateDiagram")) {
            Object.assign(result, stateData(await mermaid.mermaidAPI.getDiagramFromText(text)));
        }
        return result;
    } catch (error) {
        return { ok: false, error: String(error?.message ?? error) };
    }
}

function asTexts(value) {
    if (!Array.isArray(value) || !value.every((t) => typeof t === "string")) {
        throw new TypeError("stdin must be a JSON array of strings");
    }
    return value;
}

async function checkAll(texts) {
    const results = [];
    for (const text of texts) {
        results.push(await check(text)); // sequential: Mermaid's config is global state
    }
    return JSON.stringify(results) + "\n";
}

if (process.argv[2] === "--serve") {
    const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
    for await (const line of lines) {
        let texts;
        try {
            texts = asTexts(JSON.parse(line));
        } catch (error) {
            process.stderr.write(`parse.mjs: ${error.message}\n`);
            process.exit(2);
        }
        process.stdout.write(await checkAll(texts));
    }
} else {
    let texts;
    try {
        texts = readInputs(process.argv.slice(2));
    } catch (error) {
        process.stderr.write(`parse.mjs: ${error.message}\n`);
        process.exit(2);
    }
    process.stdout.write(await checkAll(texts));
}
