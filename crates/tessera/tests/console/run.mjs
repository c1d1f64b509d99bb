// Drives the Tessera console in headless Chromium (Debian's /usr/bin/chromium through
// playwright-core; no browser download) and checks every page with axe-core. Started by
// crates/tessera/tests/console.rs, which starts `tessera serve` and the OIDC provider and passes:
//   BASE, ADMIN_TOKEN, VIEWER_TOKEN (vision), OTHER_TOKEN (an nlp member), MEMBER_TOKEN (a
//   vision member), SHOTS (screenshot directory).
// Prints one line per step; exits non-zero with the failed step's message.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';

const require = createRequire(import.meta.url);
const axeSource = fs.readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const { BASE, ADMIN_TOKEN, VIEWER_TOKEN, OTHER_TOKEN, MEMBER_TOKEN, SHOTS } = process.env;
fs.mkdirSync(SHOTS, { recursive: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});
const problems = [];
const step = (s) => console.log(`step: ${s}`);
function check(ok, what) { if (!ok) throw new Error(what); }

async function context() {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  ctx.on('page', (p) => p.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused to/.test(m.text()) && !/fonts/.test(m.text())) {
      problems.push(`CSP violation on ${p.url()}: ${m.text()}`);
    }
  }));
  const page = await ctx.newPage();
  page.on('dialog', (d) => d.accept());
  return page;
}

// axe-core in the page (evaluated through the DevTools protocol: the page's CSP stays on).
async function axe(page, name) {
  await page.evaluate(axeSource);
  const r = await page.evaluate(() => globalThis.axe.run(document, { resultTypes: ['violations'] }));
  // Every violation fails the suite, whatever its impact (minor and moderate ones too).
  const bad = r.violations;
  for (const v of bad) problems.push(`axe ${name}: ${v.id} (${v.impact}): ${v.help} — ${v.nodes.map((n) => n.target.join(' ')).slice(0, 3).join(', ')}`);
  await page.screenshot({ path: `${SHOTS}/${name}.png`, fullPage: true });
}

// The REST API as the platform admin (setup the pages are then checked against).
function api(method, path, body) {
  return fetch(`${BASE}${path}`, {
    method,
    headers: { Authorization: `Bearer ${ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

// Screenshots at a laptop's and a phone's size (name-1440.png, name-390.png).
async function sizes(page, name) {
  const v = page.viewportSize();
  for (const [width, height] of [[1440, 900], [390, 844]]) {
    await page.setViewportSize({ width, height });
    await page.screenshot({ path: `${SHOTS}/${name}-${width}.png`, fullPage: true });
  }
  await page.setViewportSize(v);
}

async function tokenSignIn(page, token) {
  await page.goto(`${BASE}/console/signin`);
  await page.fill('#token', token);
  await page.click('button[type=submit]');
  await page.waitForURL(`${BASE}/console`);
}

try {
  // 1. A tenant-admin of vision signs in through the real OIDC provider (its dev login page).
  step('sign in through the OIDC provider');
  const alice = await context();
  await page_signin_sso(alice);
  check((await alice.textContent('header')).includes('oidc:alice'), 'signed in as oidc:alice');
  await axe(alice, 'overview');

  // 2. Request a MIG slice: pool → model → shape from the valid lists; preview before submit.
  step('request a MIG slice with the cost preview first');
  await alice.goto(`${BASE}/console/request`);
  check(await alice.locator('#submit-button').count() === 0, 'no submit button before the preview');
  await alice.selectOption('#f-pool', 'serving');
  await alice.waitForSelector('#f-shape option[value="mig:1g.10gb"]', { state: 'attached' });
  await alice.selectOption('#f-shape', 'mig:1g.10gb');
  await alice.fill('#f-name', 'notebook');
  await alice.fill('#f-duration', '2');
  await alice.click('#preview-button');
  await alice.waitForSelector('#preview');
  const preview = await alice.textContent('#preview');
  check(/Would (start|borrow)/.test(preview) && preview.includes('GPU units'), `preview: ${preview}`);
  await axe(alice, 'request-preview');
  await alice.click('#submit-button');
  await alice.waitForURL(/\/console\/workloads\/\d+$/);
  const wid = alice.url().split('/').pop();

  // 3. It reaches Running; the timeline shows its steps with durations.
  step(`workload ${wid} reaches running; its timeline`);
  for (let i = 0; i < 40; i++) {
    if ((await alice.textContent('.facts')).includes('running')) break;
    await alice.waitForTimeout(250);
    await alice.reload();
  }
  check((await alice.textContent('.facts')).includes('running'), 'the workload is running');
  const timeline = await alice.textContent('.timeline');
  check(timeline.includes('requested') && timeline.includes('running') && /\d+(\.\d)? (ms|s)/.test(timeline), `timeline: ${timeline}`);
  check((await alice.textContent('#logs-note')).includes('No logs from this backend'), 'the simulated backend keeps no logs');
  check(await alice.getAttribute('#workload-live', 'hx-trigger') === 'every 2s', 'a live workload refreshes its part of the page');
  await axe(alice, 'workload');
  // Away from the polling page: axe leaves empty style attributes that a swap would copy.
  await alice.goto(`${BASE}/console`);

  // 4. An admin sees the slice on the fleet map, coloured by tenant, with its detail on click.
  step('the admin sees the slice on the fleet map');
  const admin = await context();
  await tokenSignIn(admin, ADMIN_TOKEN);
  await admin.goto(`${BASE}/console/fleet?tenant=vision`);
  const cell = admin.locator(`.cell[title*="vision #${wid}"]`);
  check(await cell.count() === 1, 'one GPU cell holds the slice');
  const legend = await admin.locator('.legend li', { hasText: 'vision' }).locator('.sw').getAttribute('class');
  const colour = legend.split(' ').find((c) => /^t\d+$/.test(c));
  check((await cell.getAttribute('class')).split(' ').includes(colour), `the cell has vision's colour ${colour}`);
  await axe(admin, 'fleet');
  const sliceNode = (await admin.locator('table.nodes button').first().textContent()).trim();
  await admin.locator('table.nodes button').first().click();
  await admin.waitForSelector('#detail .gpu-card');
  check((await admin.textContent('#detail')).includes(`vision/train #${wid}`), 'the node detail names the slice');
  // The detail opens in a drawer in view and focused, even from the last row of a long map;
  // Escape closes it and gives focus back to the node's button.
  const drawerState = () => admin.evaluate(() => {
    const d = document.getElementById('drawer');
    const r = d.getBoundingClientRect();
    return { open: !d.hidden, focused: document.activeElement === d, inView: r.top >= 0 && r.left >= 0 && r.bottom <= window.innerHeight && r.right <= window.innerWidth && r.width > 0 };
  });
  let ds = await drawerState();
  check(ds.open && ds.focused && ds.inView, `the node drawer is open, in view and focused: ${JSON.stringify(ds)}`);
  await admin.goto(`${BASE}/console/fleet`);
  const lastNode = admin.locator('table.nodes button[data-opens-drawer]').last();
  await lastNode.focus();
  await admin.keyboard.press('Enter');
  await admin.waitForSelector('#drawer:not([hidden]) #detail .gpu-card');
  ds = await drawerState();
  check(ds.open && ds.focused && ds.inView, `from the last row too: ${JSON.stringify(ds)}`);
  check(await admin.evaluate(() => window.scrollY) > 500, 'the last row is far down the page');
  await axe(admin, 'fleet-drawer');
  await admin.keyboard.press('Escape');
  ds = await drawerState();
  check(!ds.open && await admin.evaluate(() => document.activeElement && document.activeElement.hasAttribute('data-opens-drawer')), 'Escape closes the drawer and focus returns to the node');
  await admin.keyboard.press('Enter');
  await admin.waitForSelector('#drawer:not([hidden])');
  await admin.click('#drawer [data-close-drawer]');
  check(!(await drawerState()).open, 'the close button closes it');
  // Highlight vision from the legend: the other tenants' cells are dimmed, vision's are not.
  await admin.locator('.legend a', { hasText: 'vision' }).click();
  await admin.waitForSelector('.highlight-note');
  check(await admin.locator(`.cell[title*="vision #${wid}"].dim`).count() === 0 && (await admin.locator('.legend li.on').textContent()).includes('vision'), 'highlighting vision');
  await axe(admin, 'fleet-highlight');
  // The whole-fleet heat map: a cell per GPU of the seed fleet (480), vision's marked while highlighted.
  check(await admin.locator('.heat .heat-node .hc').count() === 480, `the heat map has 480 GPU cells: ${await admin.locator('.heat .heat-node .hc').count()}`);
  check(await admin.locator('.heat .hc.hh').count() >= 1, 'the highlighted tenant is marked on the heat map');
  await admin.locator('.heat .heat-node').first().click();
  await admin.waitForSelector('table.nodes tbody tr[id^="node-"]');
  check(await admin.locator('table.nodes tbody tr[id^="node-"]').count() >= 1 && admin.url().includes('node='), 'a heat map node leads to its row');

  // 4a. A GPU fails (an XID through the simulated backend, as the node-operations tests do):
  // the map marks it (a cross, and words in its label), "unhealthy only" finds its node, the
  // detail says why; cordoning the node shows its state with a mark and the word.
  step('an unhealthy GPU and a cordoned node on the fleet map');
  await admin.goto(`${BASE}/console/fleet?pool=training`);
  const sick = (await admin.locator('table.nodes tbody tr[id^="node-"]').first().getAttribute('id')).replace(/^node-/, '');
  const fault = await api('POST', '/api/v1/sim/faults', { node: sick, gpu: 1, xid: 79 });
  check(fault.ok, `inject an XID: ${fault.status}`);
  let sickRows = 0;
  for (let i = 0; i < 40 && sickRows !== 1; i++) {
    await admin.goto(`${BASE}/console/fleet?health=unhealthy`);
    sickRows = await admin.locator('table.nodes tbody tr[id^="node-"]').count();
    if (sickRows !== 1) await admin.waitForTimeout(100);
  }
  check(sickRows === 1 && (await admin.locator(`#node-${sick}`).count()) === 1, `unhealthy only: ${sickRows} rows`);
  check(await admin.isChecked('#fl-health'), 'the filter stays checked');
  const badCell = admin.locator(`#node-${sick} .cell.bad`);
  check(await badCell.count() === 1 && (await badCell.getAttribute('aria-label')).includes('unhealthy: XID 79'), 'the failed GPU is marked, with the XID in its label');
  check((await admin.textContent(`#node-${sick}`)).includes('1 GPU unhealthy'), 'the row says so in words');
  await admin.locator(`#node-${sick} button`).click();
  await admin.waitForSelector('#detail .gpu-card.bad');
  check((await admin.textContent('#detail #gpu-1')).includes('XID 79'), 'the detail names the XID');
  check((await admin.textContent('#detail #gpu-0')).includes('healthy'), 'the other GPUs are healthy');
  await admin.click('#detail button:has-text("Cordon")');
  await admin.waitForSelector('#detail h3 .node-cordoned');
  await admin.goto(`${BASE}/console/fleet?health=unhealthy`);
  check((await admin.textContent(`#node-${sick}`)).includes('cordoned'), 'the row shows the node cordoned');
  check((await admin.locator(`#node-${sick} .cell.bad`).getAttribute('aria-label')).includes('node cordoned'), 'and the GPU label too');
  await axe(admin, 'fleet-unhealthy');
  const badHealth = await admin.goto(`${BASE}/console/fleet?health=sick`);
  check(badHealth.status() === 422, `an unknown health filter: ${badHealth.status()}`);
  await admin.goto(`${BASE}/console/audit`);
  await axe(admin, 'audit');

  // 4b. A workload over its tenant's quota limit waits; the admin's queue view shows it with
  // the scheduler's reason, and the live fragment keeps it there.
  step('the admin sees a waiting workload with its reason in the queue');
  let r = await api('PUT', '/api/v1/tenants/nlp/quotas/serving', { guaranteed: 0, limit: 0.05 });
  check(r.ok, `set nlp's quota: ${r.status}`);
  r = await api('POST', '/api/v1/workloads', { tenant: 'nlp', project: 'p', name: 'waits', shape: { mig: '1g.10gb', pool: 'serving' }, duration_s: 3600 });
  check(r.ok, `submit the waiting workload: ${r.status} ${r.ok ? '' : await r.text()}`);
  const waitId = (await r.json()).id;
  let queued = '';
  for (let i = 0; i < 40 && !queued.includes('quota'); i++) {
    await admin.goto(`${BASE}/console/queue?tenant=nlp`);
    queued = (await admin.locator(`#q-${waitId}`).count()) ? await admin.textContent(`#q-${waitId}`) : '';
    if (!queued.includes('quota')) await admin.waitForTimeout(250);
  }
  check(queued.includes('quota') && queued.includes('serving') && queued.includes('MIG 1g.10gb'), `the waiting row: ${queued}`);
  // Why, in one sentence, with the next step and the place in the tenant's queue.
  check(queued.includes('Next: raise the tenant') && queued.includes("waiting in tenant nlp's queue") && !queued.includes('`'), `the waiting row says why and what to do: ${queued}`);
  step('reason counts link to the workloads waiting for that reason');
  await admin.click('#reason-counts a:has-text("over quota")');
  await admin.waitForURL(/reason=quota/);
  check(await admin.locator(`#q-${waitId}`).count() === 1, 'the quota link lists the waiting workload');
  await axe(admin, 'queue-reason');
  await sizes(admin, 'queue-reason');
  // Refused at submission (never stored): nlp over its limit without waiting, vision asking
  // for a gang no node holds. The admin sees both; nlp's member (below) only nlp's.
  r = await api('POST', '/api/v1/workloads', { tenant: 'nlp', project: 'p', name: 'impatient', shape: { mig: '1g.10gb', pool: 'serving' }, no_wait: true });
  check(r.status === 403, `a refused submission: ${r.status}`);
  r = await api('POST', '/api/v1/workloads', { tenant: 'vision', project: 'train', name: 'huge', shape: { gpus: 9 } });
  check(r.status === 422, `a constraint: ${r.status}`);
  await admin.goto(`${BASE}/console/queue`);
  const refusedRows = await admin.textContent('table.refused');
  check(/nlp \/ p\s*impatient\s*quota/.test(refusedRows) && /vision \/ train\s*huge\s*constraint/.test(refusedRows), `the admin's refusals: ${refusedRows}`);
  check((await admin.textContent('#queue-live')).includes('nlp'), 'grouped under nlp');
  await axe(admin, 'queue');
  const badPool = await admin.goto(`${BASE}/console/queue?pool=nowhere`);
  check(badPool.status() === 422, `an unknown pool: ${badPool.status()}`);

  // 4c. Allocation over time: the serving pool holds vision's slice now; the numbers behind
  // the chart are in the table and the CSV.
  step('the chart page has data points');
  await admin.goto(`${BASE}/console/charts`);
  await admin.waitForSelector('.chart .uplot');
  const cells = await admin.locator('#pool-serving td').allTextContents();
  check(Number(cells[2]) > 0 && Number(cells[3]) >= Number(cells[2]), `serving's summary: ${cells.join(' | ')}`);
  await axe(admin, 'charts');
  const csv = await admin.evaluate(async () => (await fetch('/console/charts/data?pool=serving&format=csv')).text());
  const lines = csv.trim().split('\n');
  check(lines[0].startsWith('start_utc,minutes,') && Number(lines[lines.length - 1].split(',')[3]) > 0, `the CSV: ${lines.slice(-2).join(' / ')}`);
  // The range picker: the last 7 days, a point an hour, the current window marked.
  await admin.click('nav.ranges a:text-is("7d")');
  await admin.waitForSelector('.chart .uplot');
  check((await admin.textContent('main')).includes('The last 7 days (UTC), one point an hour'), 'the 7-day window');
  check(await admin.locator('nav.ranges a[aria-current="page"]').textContent() === '7d', 'the current window is marked');
  await axe(admin, 'charts-7d');

  // 5. A member of another tenant does not see it.
  step('another tenant does not see it');
  const other = await context();
  await tokenSignIn(other, OTHER_TOKEN);
  await other.goto(`${BASE}/console/workloads`);
  check(await other.locator(`#w-${wid}`).count() === 0, 'not in their list');
  const resp = await other.goto(`${BASE}/console/workloads/${wid}`);
  check(resp.status() === 404, `their view of it: ${resp.status()}`);
  await other.goto(`${BASE}/console/queue?tenant=vision`);
  check((await other.textContent('#queue-live')).includes('waits'), 'a member sees its own tenant\'s waiting workload');
  const theirRefusals = await other.textContent('table.refused');
  check(theirRefusals.includes('impatient') && !theirRefusals.includes('huge'), `a member sees only its tenant's refusals: ${theirRefusals}`);
  // Their fleet map is where their own tenant's work runs: the node holding vision's slice
  // says "another tenant", never vision's name or workload, and has no node operations; a
  // search for vision's workload or tenant finds nothing of it.
  const theirMap = await other.goto(`${BASE}/console/fleet`);
  check(theirMap.status() === 200 && (await other.textContent('h1')).includes("Where nlp's work runs"), `a member's fleet map: ${theirMap.status()}`);
  check(!(await other.textContent('main')).includes('vision'), 'no other tenant named on the map');
  await axe(other, 'fleet-member-empty');
  const theirNode = await other.goto(`${BASE}/console/fleet/nodes/${sliceNode}`);
  const theirNodeText = await other.textContent('body');
  check(theirNode.status() === 200 && theirNodeText.includes('(another tenant)') && !theirNodeText.includes('vision') && !theirNodeText.includes(`#${wid}`) && await other.locator('button', { hasText: 'Cordon' }).count() === 0,
    `another tenant's slice on ${sliceNode} is unnamed: ${theirNodeText.slice(0, 400)}`);
  for (const q of [`workload=${wid}`, 'tenant=vision&highlight=vision', `node=${sliceNode}`]) {
    await other.goto(`${BASE}/console/fleet?${q}`);
    const m = await other.textContent('main');
    check(!m.includes('vision') && !m.includes(`#${wid}`) && /(^|\D)0 nodes match/.test(m), `a member's search ${q} finds none of vision's work: ${m.slice(0, 300)}`);
  }
  for (const path of ['/console/audit', '/console/charts', '/console/tenants']) {
    const denied = await other.goto(`${BASE}${path}`);
    check(denied.status() === 403, `a member on ${path}: ${denied.status()}`);
  }
  // A denied page is a page: the console's navigation, the reason, no raw JSON.
  check(await other.locator('nav[aria-label="Console"] a[href="/console/workloads"]').count() === 1 && (await other.textContent('#error-h')).includes('Not allowed'), 'a denied page is HTML with the navigation');
  await axe(other, 'denied');
  // The waiting workload's page, left open: it turns running below without a reload.
  await other.goto(`${BASE}/console/workloads/${waitId}`);
  check((await other.textContent('.facts')).includes('queued'), 'it waits');
  step('the waiting workload says why, what to do and where it stands');
  check((await other.textContent('#waits-next')).includes('ask your platform admin'), 'a member is told to ask the admin');
  check((await other.textContent('#waits-position')).includes("waiting in tenant nlp's queue"), 'its place in the queue');
  check((await other.locator('#waits-pools li').allTextContents()).some((t) => t.includes('Pool training cannot serve MIG 1g.10gb')), 'the pools that cannot serve it');
  await axe(other, 'workload-waits');
  await sizes(other, 'workload-waits');
  await other.goto(`${BASE}/console/workloads/${waitId}`);

  // 5b. The admin edits nlp's quota in the form (through the API's handler); the API then
  // reports the new value; a bad value gets its message next to the field and changes nothing.
  step('the admin edits a quota in the form and the API reports it');
  await admin.goto(`${BASE}/console/tenants`);
  check(await admin.locator('#tenant-summary #sum-nlp').count() === 1, 'a summary row per tenant');
  await admin.click('#panel-nlp > summary');
  await axe(admin, 'tenants');
  await sizes(admin, 'tenants');
  // Afresh: axe leaves empty style attributes behind, which htmx's settle would copy (the CSP
  // refuses inline style, so that would be reported as a violation).
  await admin.goto(`${BASE}/console/tenants`);
  await admin.click('#panel-nlp > summary');
  await admin.selectOption('#nlp-quota-class', 'serving');
  await admin.fill('#nlp-quota-guaranteed', '1');
  await admin.fill('#nlp-quota-limit', '2');
  await admin.click('#tenant-nlp .quota-form button[type=submit]');
  let quotas = {};
  for (let i = 0; i < 50; i++) {
    quotas = await (await api('GET', '/api/v1/tenants/nlp/quotas')).json();
    if (quotas.quotas.some((q) => q.class === 'serving' && q.limit === 2)) break;
    await admin.waitForTimeout(100);
  }
  const serving = quotas.quotas.find((q) => q.class === 'serving');
  check(serving && serving.guaranteed === 1 && serving.limit === 2, `nlp's serving quota: ${JSON.stringify(serving)}`);
  step('the waiting workload\'s page turns running without a reload');
  let facts = '';
  for (let i = 0; i < 50 && !facts.includes('running'); i++) {
    await other.waitForTimeout(200);
    facts = (await other.locator('.facts').count()) ? await other.textContent('.facts') : '';
  }
  check(facts.includes('running'), `live state: ${facts} in ${other.url()}: ${(await other.content()).slice(-1500)}`);
  check((await other.textContent('.timeline')).includes('running'), 'the timeline grew in place');
  await axe(other, 'workload-live');
  await other.goto(`${BASE}/console`);
  step('a bad quota value shows its message next to the field');
  await admin.fill('#nlp-quota-guaranteed', '1');
  await admin.fill('#nlp-quota-limit', 'lots');
  await admin.click('#tenant-nlp .quota-form button[type=submit]');
  await admin.waitForSelector('#nlp-quota-limit-error');
  check((await admin.getAttribute('#nlp-quota-limit', 'aria-describedby')) === 'nlp-quota-limit-error', 'the limit field is described by its message');
  check((await admin.textContent('#nlp-quota-limit-error')).includes('lots'), 'the message names the value');
  await axe(admin, 'tenants-error');
  const after = (await (await api('GET', '/api/v1/tenants/nlp/quotas')).json()).quotas.find((q) => q.class === 'serving');
  check(after.limit === 2, `a refused edit changes nothing: ${JSON.stringify(after)}`);
  await admin.fill('#nlp-project-name', 'eval');
  await admin.click('#tenant-nlp form[hx-post$="/projects"] button[type=submit]');
  await admin.waitForSelector('#tenant-nlp .projects li:has-text("eval")');
  const projects = (await (await api('GET', '/api/v1/tenants/nlp/projects')).json()).items.map((p) => p.name);
  check(projects.includes('eval'), `nlp's projects: ${projects}`);

  // 5c. A member of nlp asks for a 16-GPU gang of the training pool in the form: a gang no
  // rack can ever hold is refused by the dry run naming the level and its capacity; several
  // bad fields are named at once in the form's words; then the dry run, the submission, the
  // workload's node-shares by rack, and the admin's fleet map by rack with the gang's cells.
  step('a member requests a multi-node gang through the form');
  const member = await context();
  await tokenSignIn(member, OTHER_TOKEN);
  await member.goto(`${BASE}/console/request`);
  await member.selectOption('#f-project', 'nlp/p');
  // Each change re-renders the dependent fields: wait for that answer before the next change.
  const fields = () => member.waitForResponse((r) => r.url().includes('/console/request/fields'));
  await Promise.all([fields(), member.selectOption('#f-pool', 'training')]);
  await member.waitForSelector('#f-shape option[value="gang"]', { state: 'attached' });
  await Promise.all([fields(), member.selectOption('#f-shape', 'gang')]);
  await member.waitForSelector('#f-gang-gpus');
  check((await member.locator('#f-topology option').allTextContents()).some((t) => t === 'rack'), 'the fleet\'s level rack is offered');
  await member.fill('#f-name', 'allreduce');
  await member.fill('#f-duration', '1');
  step('a gang no rack can hold is refused by the dry run');
  await member.fill('#f-gang-gpus', '40');
  await member.selectOption('#f-topology', 'rack');
  await member.selectOption('#f-topology-mode', 'required');
  await member.click('#preview-button');
  await member.waitForSelector('#preview');
  const never = await member.textContent('#preview .verdict');
  check(/Would refused: constraint: 40 GPUs in one rack; the largest rack of pool training, r\d, could hold at most 32 of it/.test(never.replace(/\s+/g, ' ')), `a gang no rack holds: ${never}`);
  check(await member.locator('#submit-button').count() === 0, 'no submit for a refused gang');
  step('bad gang fields are named at once');
  // Number boxes take numbers only: out of the API's bounds, each said in the form's units.
  await member.fill('#f-gang-gpus', '0');
  await member.fill('#f-segment', '0');
  await member.fill('#f-duration', '100000');
  await member.click('#preview-button');
  await member.waitForSelector('#gang_gpus-error');
  const errs = await Promise.all(['#gang_gpus-error', '#segment-error', '#duration_h-error'].map(async (sel) => (await member.locator(sel).count()) ? member.textContent(sel) : ''));
  check(errs[0].includes('GPUs in all') && errs[1].includes('Segment') && errs[2].includes('8784 hours'), `every bad field at once: ${errs.join(' | ')}`);
  check(!errs.some((e) => /shape\.|gpus_per_node/.test(e)), `in the form's words: ${errs.join(' | ')}`);
  check((await member.getAttribute('#f-gang-gpus', 'aria-describedby')).includes('gang_gpus-error'), 'the field is described by its message');
  step('a 16-GPU gang: dry run, submit, its node-shares by rack');
  await member.fill('#f-gang-gpus', '16');
  await member.fill('#f-segment', '');
  await member.fill('#f-duration', '1');
  await member.click('#preview-button');
  await member.waitForSelector('#preview-where');
  const gangPreview = await member.textContent('#preview');
  check(/Would (start|borrow)/.test(gangPreview) && /2 node-shares in r\d \(2 nodes\)/.test(gangPreview), `the gang's preview: ${gangPreview}`);
  await axe(member, 'request-gang-preview');
  await member.click('#submit-button');
  await member.waitForURL(/\/console\/workloads\/\d+$/);
  const gangId = member.url().split('/').pop();
  for (let i = 0; i < 40; i++) {
    if ((await member.textContent('.facts')).includes('running')) break;
    await member.waitForTimeout(250);
    await member.reload();
  }
  check((await member.textContent('.facts')).includes('running'), 'the gang is running');
  check((await member.textContent('.facts')).includes('16 GPU gang, within one rack (required)'), `its shape: ${await member.textContent('.facts')}`);
  const racksLine = await member.textContent('#gang-racks');
  check(/2 node-shares in rack r\d \(2 nodes, 16 GPUs\)/.test(racksLine), `its node-shares by rack: ${racksLine}`);
  const shareRows = [];
  for (const tr of await member.locator('#gang-shares tbody tr').all()) shareRows.push(await tr.locator('td').allTextContents());
  check(shareRows.length === 2 && shareRows.every((r) => /^r\d$/.test(r[0]) && /^h100-\d+$/.test(r[1]) && r[2] === '0,1,2,3,4,5,6,7' && r[3] === '8'), `its node-shares: ${JSON.stringify(shareRows)}`);
  const gangNodes = shareRows.map((r) => r[1]);
  await axe(member, 'workload-gang');
  await member.goto(`${BASE}/console`);

  step('the admin sees racks and the gang on the fleet map');
  await admin.goto(`${BASE}/console/fleet?pool=training`);
  const rackHeads = await admin.locator('tbody.rack th.rack-h').allTextContents();
  check(rackHeads.length === 4 && rackHeads.every((h) => /Rack r\d \(training\): \d+ of 32 GPUs free/.test(h)), `rack headings: ${rackHeads.join(' | ')}`);
  const gangCells = admin.locator(`.cell.gang[data-gang="${gangId}"]`);
  check(await gangCells.count() === 16, `the gang's 16 cells: ${await gangCells.count()}`);
  for (const n of gangNodes) {
    check((await admin.textContent(`#node-${n}`)).includes(`gang #${gangId} · 2 nodes`), `node ${n} names the gang`);
    check((await admin.locator(`#node-${n} .cell`).first().getAttribute('aria-label')).includes(`nlp #${gangId}; gang #${gangId} across 2 nodes`), `node ${n}'s cells name it`);
  }
  const gangRack = (await admin.locator(`tbody.rack:has(#node-${gangNodes[0]})`).getAttribute('id')).replace(/^rack-/, '');
  await admin.goto(`${BASE}/console/fleet?pool=training&rack=${gangRack}`);
  check(await admin.locator('tbody.rack').count() === 1 && (await admin.locator('table.nodes tbody tr[id^="node-"]').count()) === 4, `one rack of 4 nodes for rack=${gangRack}`);
  check((await admin.textContent('th.rack-h')).includes('GPUs free'), 'with its heading');
  await axe(admin, 'fleet-racks');

  // A member of vision (hostile to nlp) sees neither the gang's name nor its tenant: their
  // map and a node's detail name only vision's work; the workload is not theirs to read.
  step('a hostile member does not see the other tenant\'s gang');
  const hostile = await context();
  await tokenSignIn(hostile, MEMBER_TOKEN);
  for (const path of ['/console/fleet?pool=training', `/console/fleet?workload=${gangId}`, '/console/fleet?tenant=nlp&highlight=nlp', `/console/fleet/nodes/${gangNodes[0]}`]) {
    const r = await hostile.goto(`${BASE}${path}`);
    const body = await hostile.content();
    check(r.status() === 200 && !body.includes('allreduce') && !body.includes(`#${gangId}`) && !body.includes('nlp'), `a hostile member on ${path}: ${r.status()}`);
  }
  check((await hostile.textContent('body')).includes('(another tenant)') && await hostile.locator('button', { hasText: 'Drain' }).count() === 0, 'the gang node\'s GPUs are another tenant\'s, with no node operations');
  step('a member sees where their own work runs');
  await hostile.goto(`${BASE}/console/fleet`);
  check((await hostile.textContent('h1')).includes("Where vision's work runs"), 'the member\'s map');
  const mine = hostile.locator(`#node-${sliceNode} .cell[title*="vision #${wid}"]`);
  check(await mine.count() === 1 && (await mine.textContent()).trim() === 'A', `their slice's cell on ${sliceNode}, keyed A`);
  check(await hostile.locator('.heat-cells').count() > 0, 'with the whole-fleet heat map');
  await axe(hostile, 'fleet-member');
  await sizes(hostile, 'fleet-member');
  await hostile.locator(`#node-${sliceNode} button`).click();
  await hostile.waitForSelector('#detail .gpu-card');
  check((await hostile.textContent('#detail')).includes(`vision/train #${wid}`), 'the drawer names their own slice');
  check(await hostile.evaluate(() => { const d = document.getElementById('drawer'); const r = d.getBoundingClientRect(); return !d.hidden && r.top >= 0 && r.bottom <= window.innerHeight; }), 'the drawer is in view');
  await axe(hostile, 'fleet-member-drawer');
  const theirGang = await hostile.goto(`${BASE}/console/workloads/${gangId}`);
  check(theirGang.status() === 404 && !(await hostile.content()).includes('allreduce'), `the gang's page to a hostile member: ${theirGang.status()}`);
  await hostile.goto(`${BASE}/console/workloads`);
  check(await hostile.locator(`#w-${gangId}`).count() === 0 && !(await hostile.content()).includes('allreduce'), 'not in their list');

  // 6. A viewer cannot submit.
  step('a viewer cannot submit');
  const viewer = await context();
  await tokenSignIn(viewer, VIEWER_TOKEN);
  await viewer.goto(`${BASE}/console/request`);
  check(await viewer.locator('#preview-button').count() === 0, 'no preview/submit for a viewer');
  const forced = await viewer.evaluate(async () => (await fetch('/console/request', {
    method: 'POST',
    headers: { 'X-CSRF-Token': JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token'], 'Content-Type': 'application/x-www-form-urlencoded' },
    body: 'project=vision%2Ftrain&name=x&pool=serving&model=A100-80GB&shape=mig%3A1g.10gb',
  })).status);
  check(forced === 403, `a viewer's forced submission: ${forced}`);

  // 7. Bad input: the message next to the field.
  step('bad input gets a message next to the field');
  await alice.goto(`${BASE}/console/request`);
  await alice.fill('#f-name', '');
  await alice.fill('#f-duration', '100000');
  await alice.click('#preview-button');
  await alice.waitForSelector('#duration_h-error');
  check((await alice.getAttribute('#f-duration', 'aria-describedby')).split(' ').includes('duration_h-error'), 'described by its message');
  check(await alice.locator('#name-error').count() === 1, 'the empty name is named at the same time');
  check((await alice.textContent('#duration_h-error')).includes('hours') && !(await alice.textContent('#duration_h-error')).includes('duration_s'), 'said in hours');
  await axe(alice, 'request-error');

  // 8. No change without the CSRF token.
  step('a change without the CSRF token is refused');
  const noCsrf = await alice.evaluate(async (id) => (await fetch(`/console/workloads/${id}/cancel`, { method: 'POST' })).status, wid);
  check(noCsrf === 403, `cancel without the token: ${noCsrf}`);

  // 9. Cancel from the list.
  step('cancel it');
  await alice.goto(`${BASE}/console/workloads`);
  await axe(alice, 'workloads');
  step('the workload list filters by tenant/project from a list and sorts');
  await alice.selectOption('#f-project', 'vision/train');
  await alice.selectOption('#f-sort', 'oldest');
  await Promise.all([alice.waitForURL(/sort=oldest/), alice.click('form.filters button[type=submit]')]);
  check(await alice.locator('#rows tr[id^="w-"]').count() > 0, 'the filtered list has rows');
  await axe(alice, 'workloads-filtered');
  await sizes(alice, 'workloads');
  await alice.click(`#w-${wid} button`);
  // Polled from here: waitForFunction would evaluate a string in the page, which the CSP forbids.
  let row = '';
  for (let i = 0; i < 80 && !/cancelled|stopping/.test(row); i++) {
    await alice.waitForTimeout(100);
    row = await alice.textContent(`#w-${wid}`);
  }
  check(/cancelled|stopping/.test(row), `after cancel: ${row}`);
  await alice.goto(`${BASE}/console/quota`);
  await alice.waitForSelector('.chart .uplot');
  await axe(alice, 'quota');
  await alice.goto(`${BASE}/console/tokens`);
  await axe(alice, 'tokens');
  await alice.setViewportSize({ width: 390, height: 800 });
  await alice.goto(`${BASE}/console/request`);
  await alice.screenshot({ path: `${SHOTS}/request-narrow.png`, fullPage: true });
  // On a phone the navigation folds behind a Menu button and the workload list is cards:
  // nothing wider than the screen, each row's fields labelled.
  step('a phone: folded navigation, workloads as cards');
  await alice.goto(`${BASE}/console/workloads`);
  const header = await alice.locator('header.top').boundingBox();
  check(header.height < 120, `the header on a phone: ${header.height} px`);
  check(!(await alice.locator('#console-nav').isVisible()), 'the navigation is folded');
  await alice.click('.menu-toggle');
  check(await alice.locator('#console-nav a[href="/console/queue"]').isVisible(), 'Menu shows the navigation');
  check(await alice.getAttribute('.menu-toggle', 'aria-expanded') === 'true', 'Menu says it is open');
  const wide = await alice.evaluate(() => document.documentElement.scrollWidth);
  check(wide <= 390, `nothing scrolls sideways: ${wide} px`);
  const card = await alice.locator('#rows tr').first().boundingBox();
  check(card && card.x >= 0 && card.x + card.width <= 390, `a workload card fits: ${JSON.stringify(card)}`);
  const label = await alice.evaluate(() => getComputedStyle(document.querySelector('#rows td[data-label]'), '::before').content);
  check(label.includes('Id'), `fields are labelled: ${label}`);
  await alice.screenshot({ path: `${SHOTS}/workloads-phone.png`, fullPage: true });
  await axe(alice, 'workloads-phone');
  // 10. The node drawer keeps focus while open: Tab and Shift-Tab cycle within it; Escape
  // gives focus back to the node. All by keyboard.
  step('the node drawer traps focus by keyboard');
  await admin.setViewportSize({ width: 1280, height: 800 });
  await admin.goto(`${BASE}/console/fleet?pool=training`);
  const opener = admin.locator('table.nodes button[data-opens-drawer]').nth(2);
  const openerName = (await opener.textContent()).trim();
  await opener.focus();
  await admin.keyboard.press('Enter');
  await admin.waitForSelector('#drawer:not([hidden]) #detail .gpu-card');
  check(await admin.evaluate(() => document.activeElement && document.activeElement.id === 'drawer'), 'the drawer has focus once open');
  const inDrawer = () => admin.evaluate(() => {
    const d = document.getElementById('drawer');
    const a = document.activeElement;
    return { inside: d.contains(a) && a !== d, text: a ? (a.textContent || a.getAttribute('aria-label') || a.tagName).trim().slice(0, 40) : '' };
  });
  const controls = await admin.evaluate(() => Array.from(document.querySelectorAll('#drawer a[href], #drawer button')).filter((e) => e.offsetParent !== null).length);
  check(controls >= 2, `the drawer has controls: ${controls}`);
  const seen = [];
  for (let i = 0; i < controls + 2; i++) {
    await admin.keyboard.press('Tab');
    const at = await inDrawer();
    check(at.inside, `Tab ${i + 1} stays in the drawer: ${JSON.stringify(at)}`);
    seen.push(at.text);
  }
  check(seen[controls] === seen[0], `Tab wraps from the last control to the first: ${JSON.stringify(seen)}`);
  await admin.keyboard.press('Shift+Tab');
  check((await inDrawer()).inside, 'Shift-Tab stays in the drawer');
  const firstText = seen[0];
  // From the first control Shift-Tab goes to the last one.
  for (let i = 0; i < controls + 1 && (await inDrawer()).text !== firstText; i++) await admin.keyboard.press('Shift+Tab');
  await admin.keyboard.press('Shift+Tab');
  const last = await inDrawer();
  check(last.inside && last.text === seen[controls - 1], `Shift-Tab from the first goes to the last: ${JSON.stringify(last)} vs ${JSON.stringify(seen)}`);
  await axe(admin, 'fleet-drawer-keyboard');
  await admin.keyboard.press('Escape');
  check(await admin.evaluate((n) => document.activeElement && document.activeElement.textContent.trim() === n, openerName), 'Escape returns focus to the node');
  check(await admin.locator('#drawer[hidden]').count() === 1, 'Escape closes the drawer');

  // 11. The heat map by keyboard: one tab stop, arrow keys between nodes and groups, Enter.
  step('the heat map by keyboard');
  await admin.goto(`${BASE}/console/fleet`);
  const stops = await admin.locator('[data-heat-node][tabindex="0"]').count();
  check(stops === 1, `one tab stop on the heat map: ${stops}`);
  // Tab reaches it from the element before it.
  await admin.evaluate(() => { const h = document.getElementById('heat-h'); h.tabIndex = -1; h.focus(); });
  await admin.keyboard.press('Tab');
  const focusedNode = () => admin.evaluate(() => {
    const a = document.activeElement;
    const all = Array.from(document.querySelectorAll('[data-heat-node]'));
    return { index: all.indexOf(a), label: a && a.getAttribute('aria-label'), tab: a && a.tabIndex, count: all.length };
  });
  let fn = await focusedNode();
  check(fn.index === 0 && /GPUs free/.test(fn.label), `Tab lands on the first node: ${JSON.stringify(fn)}`);
  await admin.keyboard.press('ArrowRight');
  fn = await focusedNode();
  check(fn.index === 1 && fn.tab === 0, `ArrowRight: the next node, now the tab stop: ${JSON.stringify(fn)}`);
  check(await admin.locator('[data-heat-node][tabindex="0"]').count() === 1, 'still one tab stop');
  await admin.keyboard.press('ArrowDown');
  fn = await focusedNode();
  const secondGroup = await admin.evaluate(() => {
    const all = Array.from(document.querySelectorAll('[data-heat-node]'));
    return all.indexOf(document.querySelectorAll('[data-heat]')[1].querySelector('[data-heat-node]'));
  });
  check(fn.index === secondGroup, `ArrowDown: the next group's first node (${secondGroup}): ${JSON.stringify(fn)}`);
  await admin.keyboard.press('End');
  fn = await focusedNode();
  check(fn.index === fn.count - 1, `End: the last node: ${JSON.stringify(fn)}`);
  await admin.keyboard.press('Home');
  fn = await focusedNode();
  check(fn.index === 0, `Home: the first node: ${JSON.stringify(fn)}`);
  await admin.keyboard.press('ArrowRight');
  const target = (await focusedNode()).label.split(':')[0];
  await axe(admin, 'fleet-heat-keyboard');
  await Promise.all([admin.waitForURL(/node=/), admin.keyboard.press('Enter')]);
  check(await admin.locator(`#node-${target}`).count() === 1, `Enter opens ${target}'s row`);

  // 12. Twenty tenants with work: past the 16 colours a pattern, so no two look the same.
  step('twenty tenants on the fleet map');
  const extra = [];
  for (let i = 0; i < 20; i++) extra.push(`team${String(i).padStart(2, '0')}`);
  for (const t of extra) {
    check((await api('POST', '/api/v1/tenants', { name: t })).ok, `tenant ${t}`);
    check((await api('POST', `/api/v1/tenants/${t}/projects`, { name: 'p' })).ok, `project of ${t}`);
    const r = await api('POST', '/api/v1/workloads', { tenant: t, project: 'p', name: 'x', shape: { gpus: 1, pool: 'training' } });
    check(r.ok, `a workload of ${t}: ${r.status} ${await r.text()}`);
  }
  let sw = [];
  for (let i = 0; i < 100; i++) {
    await admin.goto(`${BASE}/console/fleet`);
    sw = await admin.locator('.legend li a .sw').evaluateAll((els) => els.map((e) => e.className));
    if (sw.length >= 20) break;
    await admin.waitForTimeout(200);
  }
  check(sw.length >= 20, `at least twenty tenants in the legend: ${sw.length}`);
  check(new Set(sw).size === sw.length, `each tenant its own colour and pattern: ${JSON.stringify(sw)}`);
  const keys20 = await admin.locator('.legend li a .sw').allTextContents();
  check(new Set(keys20).size === keys20.length, `each tenant its own key: ${keys20}`);
  const hatch = await admin.locator('.legend .sw.p1').first().evaluate((e) => getComputedStyle(e).backgroundImage);
  check(hatch.includes('gradient'), `a hatched swatch is drawn with a pattern: ${hatch}`);
  const patterned = await admin.locator('table.nodes .cell.p1').count();
  check(patterned >= 1, `hatched cells on the map: ${patterned}`);
  await axe(admin, 'fleet-20-tenants');
  await sizes(admin, 'fleet-20-tenants');

  // 13. Phones: the request form, the tenants summary and the nodes as cards, nothing wider
  // than the screen, each card's action in reach.
  step('a phone: the request form, tenants and nodes');
  await admin.setViewportSize({ width: 390, height: 844 });
  const fitsPhone = async (page, name) => {
    const w = await page.evaluate(() => document.documentElement.scrollWidth);
    check(w <= 390, `${name}: nothing scrolls sideways at 390 px: ${w} px`);
  };
  const inReach = async (loc, what) => {
    const b = await loc.boundingBox();
    check(b && b.x >= 0 && b.x + b.width <= 390, `${what} is in reach: ${JSON.stringify(b)}`);
  };
  await admin.goto(`${BASE}/console/tenants`);
  await fitsPhone(admin, 'tenants');
  await inReach(admin.locator('#tenant-summary tr[id^="sum-"]').first(), 'a tenant card');
  await inReach(admin.locator('#tenant-summary tr[id^="sum-"] a.button').first(), 'a tenant card\'s Edit');
  const tlabel = await admin.evaluate(() => getComputedStyle(document.querySelector('#tenant-summary td[data-label]'), '::before').content);
  check(tlabel.includes('Projects'), `tenant card fields are labelled: ${tlabel}`);
  await admin.screenshot({ path: `${SHOTS}/tenants-phone.png`, fullPage: true });
  await axe(admin, 'tenants-phone');
  await admin.goto(`${BASE}/console/fleet?pool=training`);
  await fitsPhone(admin, 'fleet');
  const nodeCard = admin.locator('table.nodes tbody tr[id^="node-"]').first();
  await inReach(nodeCard, 'a node card');
  await inReach(nodeCard.locator('button[data-opens-drawer]'), 'a node card\'s button');
  const nlabel = await admin.evaluate(() => getComputedStyle(document.querySelector('table.nodes td[data-label="Pool"]'), '::before').content);
  check(nlabel.includes('Pool'), `node card fields are labelled: ${nlabel}`);
  await admin.screenshot({ path: `${SHOTS}/fleet-phone.png`, fullPage: true });
  await axe(admin, 'fleet-phone');
  await admin.goto(`${BASE}/console/request`);
  await fitsPhone(admin, 'request');
  await inReach(admin.locator('#preview-button'), 'the request form\'s preview button');
  const fieldBoxes = await admin.locator('form#request input:visible, form#request select:visible').evaluateAll((els) => els.map((e) => { const r = e.getBoundingClientRect(); return [r.x, r.x + r.width]; }));
  check(fieldBoxes.length > 0 && fieldBoxes.every(([a, b]) => a >= 0 && b <= 390), `every field of the form fits: ${JSON.stringify(fieldBoxes)}`);
  // Its sections are cards (a border, a legend), each field labelled in them.
  const formCards = await admin.locator('form#request fieldset.form-card').evaluateAll((els) => els.map((e) => {
    const r = e.getBoundingClientRect();
    return { legend: e.querySelector('legend')?.textContent, border: getComputedStyle(e).borderTopWidth, x: r.x, right: r.x + r.width };
  }));
  check(formCards.length === 3 && formCards.every((c) => c.legend && c.border !== '0px' && c.x >= 0 && c.right <= 390), `the request form's sections are cards: ${JSON.stringify(formCards)}`);
  const unlabelled = await admin.locator('form#request input:visible, form#request select:visible').evaluateAll((els) => els.filter((e) => !(e.labels && e.labels.length)).map((e) => e.id));
  check(unlabelled.length === 0, `every field has its label: ${unlabelled}`);
  // Preview stays on the screen while the form scrolls.
  const pv = await admin.locator('#preview-button').boundingBox();
  check(pv && pv.y >= 0 && pv.y + pv.height <= 844, `Preview is on the screen without scrolling: ${JSON.stringify(pv)}`);
  await admin.screenshot({ path: `${SHOTS}/request-phone.png`, fullPage: true });
  await axe(admin, 'request-phone');
  // A remainder gang on a phone (issue 29): the checkbox and its one-line explanation in the
  // gang's card, the dry run of 12 GPUs on two node-shares, Submit in reach.
  step('a phone: a remainder gang through the request form');
  // A choice the form already shows sends no request: wait for the fields only on a change.
  const choose = async (sel, value) => {
    if ((await admin.inputValue(sel)) === value) return;
    await Promise.all([admin.waitForResponse((r) => r.url().includes('/console/request/fields')), admin.selectOption(sel, value)]);
  };
  await choose('#f-pool', 'training');
  await admin.waitForSelector('#f-shape option[value="gang"]', { state: 'attached' });
  await choose('#f-shape', 'gang');
  await admin.waitForSelector('#f-remainder');
  const remNote = await admin.textContent('#remainder-note');
  check(/the last node takes the rest, e\.g\. 12 = 8 \+ 4/.test(remNote), `the remainder's explanation: ${remNote}`);
  await inReach(admin.locator('#f-remainder'), 'the remainder checkbox');
  await admin.fill('#f-name', 'phone-rest');
  await admin.fill('#f-gang-gpus', '12');
  await admin.check('#f-remainder');
  await admin.fill('#f-duration', '1');
  await admin.click('#preview-button');
  await admin.waitForSelector('#preview');
  const remVerdict = (await admin.textContent('#preview')).replace(/\s+/g, ' ');
  check(/Would (start|borrow|wait)/.test(remVerdict) && /GPU units\s*12\b/.test(remVerdict), `a remainder gang's dry run: ${remVerdict}`);
  check(await admin.isChecked('#f-remainder'), 'the box stays ticked after the dry run');
  await fitsPhone(admin, 'request with a remainder gang');
  await admin.locator('#submit-button').scrollIntoViewIfNeeded();
  await inReach(admin.locator('#submit-button'), 'Submit after the dry run');
  await axe(admin, 'request-remainder-phone');
  // The same box with Nodes given: the error next to the box, in the form's words.
  await admin.fill('#f-gang-nodes', '2');
  await admin.click('#preview-button');
  await admin.waitForSelector('#remainder-error');
  const remErr = await admin.textContent('#remainder-error');
  check(remErr.includes('leave Nodes blank') && !remErr.includes('`'), `the remainder's field error: ${remErr}`);
  await axe(admin, 'request-remainder-error-phone');
  // The queue: the groups, the waiting workloads and the refusals as cards of labelled fields.
  step('a phone: the queue and its refusals as cards');
  await admin.goto(`${BASE}/console/queue`);
  await fitsPhone(admin, 'queue');
  for (const table of ['table.queue', 'table.recent', 'table.refused']) {
    const row = admin.locator(`${table} tbody tr`).first();
    await inReach(row, `a card of ${table}`);
    check(await row.evaluate((e) => getComputedStyle(e).display) === 'block', `${table}'s rows are cards`);
  }
  const refusedCard = await admin.locator('table.refused tbody tr').first().textContent();
  check(/impatient|huge/.test(refusedCard), `a refusal's card: ${refusedCard}`);
  const qlabel = await admin.evaluate(() => getComputedStyle(document.querySelector('table.refused td[data-label]'), '::before').content);
  check(qlabel.includes('When'), `refusal card fields are labelled: ${qlabel}`);
  await admin.screenshot({ path: `${SHOTS}/queue-phone.png`, fullPage: true });
  await axe(admin, 'queue-phone');
  // The workloads list: cards, each running workload's Cancel in reach.
  step('a phone: workloads as cards with Cancel in reach');
  r = await api('POST', '/api/v1/workloads', { tenant: 'vision', project: 'train', name: 'phone-cancel', shape: { fraction: 250 }, duration_s: 3600 });
  check(r.status === 201, `a workload to cancel: ${r.status}`);
  const phoneId = (await r.json()).id;
  await admin.goto(`${BASE}/console/workloads`);
  await fitsPhone(admin, 'workloads');
  await inReach(admin.locator(`#w-${phoneId}`), 'a workload card');
  await admin.locator(`#w-${phoneId} button`).scrollIntoViewIfNeeded();
  await inReach(admin.locator(`#w-${phoneId} button`), 'its Cancel button');
  check((await admin.textContent(`#w-${phoneId} button`)).includes('Cancel'), 'the card\'s button is Cancel');
  await admin.screenshot({ path: `${SHOTS}/workloads-admin-phone.png`, fullPage: true });
  await axe(admin, 'workloads-admin-phone');
  await admin.setViewportSize({ width: 1280, height: 800 });

  // 14. The quota form shows the chosen class's current quota.
  step('the quota form is filled with the current quota');
  await admin.goto(`${BASE}/console/tenants`);
  await admin.click('#panel-nlp > summary');
  await admin.selectOption('#nlp-quota-class', 'serving');
  check(await admin.inputValue('#nlp-quota-guaranteed') === '1' && await admin.inputValue('#nlp-quota-limit') === '2', `serving's quota in the fields: ${await admin.inputValue('#nlp-quota-guaranteed')} / ${await admin.inputValue('#nlp-quota-limit')}`);
  await axe(admin, 'tenants-quota-prefill');

  // 15. A tenant over its budget is flagged in words on the tenants page (vision's running
  // slice spends a 0.0001 GPU-unit-hour budget within seconds).
  step('an over-budget tenant is flagged');
  r = await api('PUT', '/api/v1/tenants/vision/budget', { monthly_unit_hours: 0.0001 });
  check(r.ok, `vision's budget: ${r.status}`);
  for (let i = 0; i < 60; i++) {
    await admin.goto(`${BASE}/console/tenants`);
    if (await admin.locator('#vision-over-budget').count()) break;
    await admin.waitForTimeout(500);
  }
  check((await admin.textContent('#vision-over-budget')).includes('Over budget'), 'vision is flagged over budget in words');
  check(await admin.locator('#nlp-over-budget').count() === 0, 'nlp, without a budget, is not');
  await axe(admin, 'tenants-over-budget');
  await sizes(admin, 'tenants-over-budget');

  const signin = await context();
  await signin.goto(`${BASE}/console/signin`);
  await axe(signin, 'signin');

  // Every console page at a laptop's and a phone's size (page-NAME-1440.png, page-NAME-390.png):
  // on the phone nothing scrolls sideways.
  step('every page at both sizes; nothing scrolls sideways on a phone');
  const everyPage = [
    [admin, 'overview', '/console'],
    [admin, 'request', '/console/request'],
    [admin, 'workloads', '/console/workloads'],
    [admin, 'workload', `/console/workloads/${wid}`],
    [admin, 'queue', '/console/queue'],
    [admin, 'fleet', '/console/fleet'],
    [admin, 'fleet-node', `/console/fleet/nodes/${sliceNode}`],
    [admin, 'charts', '/console/charts'],
    [admin, 'tenants', '/console/tenants'],
    [admin, 'audit', '/console/audit'],
    [admin, 'tokens', '/console/tokens'],
    [alice, 'quota', '/console/quota'],
    [member, 'workload-gang-member', `/console/workloads/${gangId}`],
    [admin, 'not-found', '/console/nowhere'],
    [signin, 'signin', '/console/signin'],
  ];
  for (const [page, name, path] of everyPage) {
    // Loaded at each size, as a laptop's and a phone's browser load it (charts are drawn to
    // the width the page loads at).
    for (const [width, height] of [[1440, 900], [390, 844]]) {
      await page.setViewportSize({ width, height });
      await page.goto(`${BASE}${path}`);
      await page.waitForLoadState('load');
      await page.screenshot({ path: `${SHOTS}/page-${name}-${width}.png`, fullPage: true });
      if (width === 390) {
        const wide = await page.evaluate(() => [document.scrollingElement.scrollWidth, window.innerWidth]);
        check(wide[0] <= wide[1], `${name} (${path}): nothing scrolls sideways at 390 px: ${wide[0]} > ${wide[1]} px`);
      }
    }
    await page.setViewportSize({ width: 1280, height: 800 });
  }
} catch (e) {
  problems.push(`failed: ${e.message.split('\n')[0]}`);
}
await browser.close();
if (problems.length) {
  for (const p of problems) console.log(p);
  process.exit(1);
}
console.log('ok');

async function page_signin_sso(page) {
  await page.goto(`${BASE}/console/signin`);
  await page.click('a[href="/auth/login"]');
  // The provider's dev login page, then its consent page.
  await page.waitForSelector('input[name=login]');
  await page.fill('input[name=login]', 'alice');
  await page.fill('input[name=password]', 'any');
  await page.click('button[type=submit]');
  for (let i = 0; i < 5 && !page.url().startsWith(`${BASE}/console`); i++) {
    const consent = page.locator('button[type=submit]');
    if (await consent.count()) {
      await Promise.all([page.waitForLoadState(), consent.first().click()]);
    }
    await page.waitForTimeout(200);
  }
  await page.waitForURL(`${BASE}/console`);
}
