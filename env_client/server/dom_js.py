"""JavaScript run in the MiniWoB page: the accessibility-tree walker and the ground-truth dump.

Both walk the page body in document order (jQuery UI puts dialogs outside ``#wrap``), skip
MiniWoB's own overlays, and report boxes in page CSS pixels clipped to the 160×210 task area;
the Python side scales them to screen pixels.
"""

# Shared helpers. arguments[0], arguments[1]: task area width and height (CSS px).
_COMMON = r"""
var W = arguments[0], H = arguments[1];
var INTERACTIVE = {button:1, link:1, textbox:1, searchbox:1, checkbox:1, radio:1, combobox:1,
  listbox:1, tab:1, option:1, menuitem:1, slider:1, spinbutton:1, switch:1, treeitem:1};
var SKIP = {'reward-display':1, 'click-canvas':1, 'sync-task-cover':1};
function squash(s) { return (s || '').replace(/\s+/g, ' ').trim(); }
function clip(r) {
  var x0 = Math.max(0, r.left), y0 = Math.max(0, r.top);
  var x1 = Math.min(W, r.right), y1 = Math.min(H, r.bottom);
  if (x1 - x0 < 1 || y1 - y0 < 1) return null;
  return [x0, y0, x1 - x0, y1 - y0];
}
function shown(el) {
  var cs = window.getComputedStyle(el);
  return cs.display !== 'none' && cs.visibility !== 'hidden' && cs.opacity !== '0';
}
function roleOf(el) {
  var ar = (el.getAttribute('role') || '').toLowerCase();
  if (INTERACTIVE[ar]) return ar;
  if (ar === 'presentation' || ar === 'none') return null;
  var t = el.tagName.toLowerCase();
  if (t === 'button') return 'button';
  if (t === 'input') {
    var ty = (el.type || 'text').toLowerCase();
    if (ty === 'hidden') return null;
    if (ty === 'button' || ty === 'submit' || ty === 'reset' || ty === 'image') return 'button';
    if (ty === 'checkbox' || ty === 'radio') return ty;
    if (ty === 'range') return 'slider';
    if (ty === 'number') return 'spinbutton';
    return 'textbox';
  }
  if (t === 'textarea') return 'textbox';
  if (t === 'select') return 'combobox';
  if (t === 'a' && el.hasAttribute('href')) return 'link';
  if (el.classList && el.classList.contains('alink')) return 'link';
  if (el.getAttribute('contenteditable') === 'true') return 'textbox';
  return null;
}
function labelText(el) {
  return (el.labels && el.labels.length) ? squash(el.labels[0].textContent) : '';
}
function nameOf(el, role) {
  var aria = el.getAttribute('aria-label');
  if (aria) return squash(aria);
  if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA' || el.tagName === 'SELECT') {
    if (role === 'button') return squash(el.value) || squash(el.getAttribute('title'));
    return labelText(el) || squash(el.getAttribute('placeholder')) ||
      squash(el.getAttribute('title'));
  }
  return squash(el.innerText || el.textContent) || squash(el.getAttribute('title'));
}
function valueOf(el) {
  if (el.tagName !== 'INPUT' && el.tagName !== 'TEXTAREA') return squash(el.innerText);
  var v = el.value || '';
  return (el.type === 'password') ? new Array(v.length + 1).join('*') : v;
}
function textBox(node) {
  var rg = document.createRange();
  rg.selectNodeContents(node);
  return rg.getBoundingClientRect();
}
function meta() {
  return {done: !!WOB_DONE_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,
          reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON)};
}
"""

# Returns {meta, nodes}: nodes are {role, name, box, value?, checked?, focused?, disabled?}.
A11Y_JS = (
    _COMMON
    + r"""
var out = [];
function emit(role, name, rect, el) {
  var b = clip(rect);
  if (!b) return;
  var n = {role: role, name: name.slice(0, 160), box: b};
  if (el) {
    if (role === 'textbox' || role === 'searchbox') n.value = valueOf(el).slice(0, 160);
    if (role === 'checkbox' || role === 'radio') n.checked = !!el.checked;
    if (document.activeElement === el) n.focused = true;
    if (el.disabled) n.disabled = true;
  }
  out.push(n);
}
function walk(el) {
  if (SKIP[el.id] || !shown(el)) return;
  var rect = el.getBoundingClientRect();
  if (el.id === 'query') { emit('text', squash(el.textContent), rect); return; }
  var role = roleOf(el);
  if (role) { emit(role, nameOf(el, role), rect, el); return; }
  var t = el.tagName.toLowerCase();
  if (t === 'img' || t === 'svg' || t === 'canvas') {
    emit(t === 'img' ? 'image' : 'graphic', squash(el.getAttribute('alt') ||
      el.getAttribute('aria-label')), rect);
    return;
  }
  for (var c = el.firstChild; c; c = c.nextSibling) {
    if (c.nodeType === 3) { var s = squash(c.data); if (s) emit('text', s, textBox(c)); }
    else if (c.nodeType === 1) walk(c);
  }
}
for (var c = document.body.firstElementChild; c; c = c.nextElementSibling) walk(c);
return {meta: meta(), nodes: out};
"""
)

# Returns {meta, utterance, elements}: every shown element of the task area with its DOM id,
# classes, text, value/checked, label, role and box. Ground truth for scripted solvers/oracles.
DEBUG_JS = (
    _COMMON
    + r"""
var out = [];
var all = document.body.querySelectorAll('*');
// A point of the box where a click lands on this element (not on one drawn over it).
function hitPoint(el, b) {
  var fx = [0.5, 0.3, 0.7, 0.15, 0.85], fy = [0.5, 0.3, 0.7, 0.15, 0.85];
  for (var i = 0; i < fx.length; i++) for (var j = 0; j < fy.length; j++) {
    var x = b[0] + b[2] * fx[i], y = b[1] + b[3] * fy[j];
    var top = document.elementFromPoint(x, y);
    if (top && (top === el || el.contains(top))) return [x, y];
  }
  return null;
}
for (var i = 0; i < all.length; i++) {
  var el = all[i], skip = false;
  for (var p = el; p; p = p.parentElement) { if (SKIP[p.id]) { skip = true; break; } }
  if (skip || !shown(el)) continue;
  var b = clip(el.getBoundingClientRect());
  if (!b) continue;
  var tag = el.tagName.toLowerCase();
  if (tag === 'input') tag += '_' + (el.type || 'text').toLowerCase();
  var own = '';
  for (var c = el.firstChild; c; c = c.nextSibling) if (c.nodeType === 3) own += ' ' + c.data;
  var e = {tag: tag, id: el.id || '', classes: (typeof el.className === 'string') ?
           el.className : '', text: squash(el.innerText || el.textContent).slice(0, 300),
           own_text: squash(own).slice(0, 300), role: roleOf(el), box: b,
           focused: document.activeElement === el, hit: hitPoint(el, b)};
  if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA') {
    e.value = el.value;
    e.label = labelText(el);
    if (el.type === 'checkbox' || el.type === 'radio') e.checked = !!el.checked;
  }
  out.push(e);
}
var q = document.getElementById('query');
return {meta: meta(), utterance: q ? squash(q.textContent) : '', elements: out};
"""
)

# After page load: the sync cover ("START") MiniWoB shows when an episode ends would start a new
# episode when clicked. Keep it hidden, so an ended episode keeps its final screen and a stray
# click cannot start another problem behind the server's back.
NO_COVER_JS = r"""
core.startEpisode = function () { core.createDisplay(); };
if (core.cover_div) { core.cover_div.style.display = 'none'; core.cover_div.onclick = null; }
return true;
"""

PAGE_READY_JS = r"""
return (typeof core !== 'undefined') && !!core.cover_div && (typeof genProblem === 'function');
"""
