// Counts a cache-tests run as cache-tests.fyi scores it: every test whose
// `kind` is "required" (or unset) counts, browser-only ones included (a
// proxy leaves them untested, so they fail, as on the published table); a
// test passes only when its own result is `true` and every test it
// `depends_on` passed (the suite's own `determineTestResult` with
// dependencies honoured).
//
// usage: node count.mjs results.json  ->  {"required", "passed", "failing": [...]}
import fs from 'fs'
import { determineTestResult, resultTypes } from './suite/test-engine/lib/results.mjs'
import suites from './suite/tests/index.mjs'

const results = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
let required = 0
let passed = 0
const failing = []
for (const suite of suites) {
  for (const test of suite.tests) {
    if (test.kind !== undefined && test.kind !== 'required') continue
    required++
    const result = determineTestResult(suites, test.id, results)
    if (result === resultTypes.pass) {
      passed++
    } else {
      const detail = results[test.id]
      failing.push({
        id: test.id,
        suite: suite.id,
        result: result[2],
        browser_only: test.browser_only === true,
        detail: Array.isArray(detail) ? String(detail[1] || detail[0]) : ''
      })
    }
  }
}
console.log(JSON.stringify({ required, passed, failing }))
