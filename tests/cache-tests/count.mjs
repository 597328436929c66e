// Counts a run of the HTTP caching test suite (http-cache-tests, as its
// cli.mjs runs it: the suites of tests/index.mjs and surrogate-control) the
// way cache-tests.fyi scores it (the package's lib/display.mjs
// `determineTestResult`, which is written for a browser and cannot be
// imported here): every test whose `kind` is "required" (or unset) counts,
// browser-only ones included (a proxy leaves them untested, so they fail,
// as on the published table); a test passes when its own result is `true`
// and every test it `depends_on` passed.
//
// usage: node count.mjs results.json  ->  {"required", "passed", "failing": [...]}
import fs from 'fs'
import suites from 'http-cache-tests/tests/index.mjs'
import surrogate from 'http-cache-tests/tests/surrogate-control.mjs'

const all = [...suites, surrogate]
const results = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
const byId = new Map()
for (const suite of all) {
  for (const test of suite.tests) byId.set(test.id, test)
}

// Whether `id` passed (a `check` answered yes counts, as the table does).
function passed (id, seen = new Set()) {
  if (seen.has(id)) return false
  seen.add(id)
  const test = byId.get(id)
  if (results[id] !== true) return false
  return (test.depends_on || []).every(dep => passed(dep, seen))
}

let required = 0
let passedCount = 0
const failing = []
for (const suite of all) {
  for (const test of suite.tests) {
    if (test.kind !== undefined && test.kind !== 'required') continue
    required++
    if (passed(test.id)) {
      passedCount++
      continue
    }
    const detail = results[test.id]
    const unmet = (test.depends_on || []).filter(dep => !passed(dep))
    failing.push({
      id: test.id,
      suite: suite.id,
      result: detail === undefined ? 'untested' : unmet.length > 0 ? 'dependency' : 'fail',
      browser_only: test.browser_only === true,
      detail: Array.isArray(detail) ? String(detail[1] || detail[0]) : unmet.join(' ')
    })
  }
}
console.log(JSON.stringify({ required, passed: passedCount, failing }))
