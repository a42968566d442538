// Reading the Prometheus text format of /metrics: samples by name and labels.

const SAMPLE = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /(\w+)="((?:[^"\\]|\\.)*)"/g;

/** Parse exposition text into [{name, labels, value}] (comments and bad lines skipped). */
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = SAMPLE.exec(line);
    if (!match) continue;
    const labels = {};
    for (const [, key, value] of (match[2] || "").matchAll(LABEL)) {
      labels[key] = value.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    }
    samples.push({ name: match[1], labels, value: parseFloat(match[3]) });
  }
  return samples;
}

/** Sum of one metric's samples per value of `label`: {labelValue: total}. */
export function sumBy(samples, name, label) {
  const out = {};
  for (const sample of samples) {
    if (sample.name !== name || !Number.isFinite(sample.value)) continue;
    const key = sample.labels[label] ?? "";
    out[key] = (out[key] || 0) + sample.value;
  }
  return out;
}
