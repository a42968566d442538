// A small, safe Markdown renderer for model answers: paragraphs, headings, lists, fenced code
// blocks, inline code, bold and italic. It builds DOM nodes and sets only textContent: model text
// is never parsed as HTML, so a "<script>" in an answer is shown as those characters.

const FENCE = /^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/;
const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
// Inline spans, first match wins: `code`, **bold**, __bold__, *italic*, _italic_ (not inside words).
const INLINE = new RegExp(
  [
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)",
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",
    "(?<!\\w)__(?=\\S)([\\s\\S]*?\\S)__(?!\\w)",
    "\\*(?=[^\\s*])([^*]*?[^\\s*])\\*",
    "(?<!\\w)_(?=[^\\s_])([^_]*?[^\\s_])_(?!\\w)",
  ].join("|"),
);

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

/** Append `text` to `parent` with its inline spans as elements (text nodes only, never HTML). */
export function renderInline(text, parent) {
  let rest = text;
  while (rest) {
    const match = INLINE.exec(rest);
    if (!match) {
      parent.append(document.createTextNode(rest));
      return;
    }
    if (match.index) parent.append(document.createTextNode(rest.slice(0, match.index)));
    const [, ticks, code, bold, bold2, italic, italic2] = match;
    if (ticks) {
      const node = el("code");
      node.textContent = code.length > 2 && code.startsWith(" ") && code.endsWith(" ") ? code.slice(1, -1) : code;
      parent.append(node);
    } else if (bold !== undefined || bold2 !== undefined) {
      const node = el("strong");
      renderInline(bold ?? bold2, node);
      parent.append(node);
    } else {
      const node = el("em");
      renderInline(italic ?? italic2, node);
      parent.append(node);
    }
    rest = rest.slice(match.index + match[0].length);
  }
}

function codeBlock(language, lines) {
  const pre = el("pre");
  const code = el("code");
  if (language) code.dataset.language = language;
  code.textContent = lines.join("\n");
  pre.append(code);
  return pre;
}

function paragraph(lines) {
  // Line breaks and indentation are kept (the style sheet sets white-space: pre-wrap): a model's
  // unfenced code or verse keeps its shape.
  const p = el("p");
  lines.forEach((line, i) => {
    if (i) p.append(document.createTextNode("\n"));
    renderInline(line, p);
  });
  return p;
}

/** Render `text` as Markdown into `container`, replacing what it held. An unclosed fence (a
 *  stream still writing its code block) shows as a code block so far. */
export function renderMarkdown(text, container) {
  const out = document.createDocumentFragment();
  const lines = text.split(/\r?\n/);
  let para = [];
  let list = null; // {node, ordered}
  const flush = () => {
    if (para.length) out.append(paragraph(para));
    para = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      flush();
      list = null;
      const body = [];
      let j = i + 1;
      while (j < lines.length && !lines[j].trim().startsWith(fence[1])) body.push(lines[j++]);
      out.append(codeBlock(fence[2], body));
      i = j;
      continue;
    }
    if (!line.trim()) {
      flush();
      list = null;
      continue;
    }
    const item = LIST_ITEM.exec(line);
    if (item) {
      flush();
      const ordered = /\d/.test(item[2]);
      if (!list || list.ordered !== ordered) {
        list = { node: el(ordered ? "ol" : "ul"), ordered };
        if (ordered && parseInt(item[2], 10) !== 1) list.node.start = parseInt(item[2], 10);
        out.append(list.node);
      }
      const li = el("li");
      renderInline(item[3], li);
      list.node.append(li);
      continue;
    }
    if (list && /^\s{2,}\S/.test(line)) {
      // an indented line continues the last list item
      const last = list.node.lastChild;
      last.append(el("br"));
      renderInline(line.trim(), last);
      continue;
    }
    list = null;
    const heading = HEADING.exec(line);
    if (heading) {
      flush();
      const h = el(`h${Math.min(6, heading[1].length + 2)}`);
      renderInline(heading[2], h);
      out.append(h);
      continue;
    }
    para.push(line);
  }
  flush();
  container.replaceChildren(out);
}
