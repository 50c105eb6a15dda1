// A line chart of a sandbox's metrics on a <canvas>: CPU use (% of its limit, left axis) and
// memory (MiB, right axis, up to its limit), the last `capacity` samples.

export class MetricsChart {
  constructor(canvas, capacity = 120) {
    this.canvas = canvas;
    this.capacity = capacity;
    this.samples = [];
  }

  add(sample) {
    this.samples.push(sample);
    if (this.samples.length > this.capacity) this.samples.shift();
    this.canvas.dataset.samples = String(this.samples.length);
    this.draw();
  }

  draw() {
    const c = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const w = c.clientWidth || 600;
    const hgt = c.clientHeight || 240;
    if (c.width !== Math.round(w * ratio)) c.width = Math.round(w * ratio);
    if (c.height !== Math.round(hgt * ratio)) c.height = Math.round(hgt * ratio);
    const g = c.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, w, hgt);
    const pad = { l: 44, r: 56, t: 12, b: 22 };
    const pw = w - pad.l - pad.r;
    const ph = hgt - pad.t - pad.b;
    const last = this.samples[this.samples.length - 1];
    const cpuMax = Math.max(100, ...this.samples.map((s) => s.cpu_used_pct || 0));
    const memMax = Math.max(1, last?.mem_total_mib || 0, ...this.samples.map((s) => s.mem_used_mib || 0));
    g.strokeStyle = "#d8dde4";
    g.fillStyle = "#6b7686";
    g.font = "11px system-ui, sans-serif";
    g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = pad.t + (ph * i) / 4;
      g.beginPath();
      g.moveTo(pad.l, y);
      g.lineTo(pad.l + pw, y);
      g.stroke();
      g.textAlign = "right";
      g.fillText(`${Math.round(cpuMax * (1 - i / 4))}%`, pad.l - 4, y + 4);
      g.textAlign = "left";
      g.fillText(`${Math.round(memMax * (1 - i / 4))} MiB`, pad.l + pw + 4, y + 4);
    }
    const x = (i) => pad.l + (pw * i) / Math.max(1, this.capacity - 1);
    const line = (color, value, max) => {
      g.strokeStyle = color;
      g.lineWidth = 2;
      g.beginPath();
      this.samples.forEach((s, i) => {
        const y = pad.t + ph * (1 - Math.min(1, (value(s) || 0) / max));
        if (i === 0) g.moveTo(x(i), y);
        else g.lineTo(x(i), y);
      });
      g.stroke();
      const lastY = pad.t + ph * (1 - Math.min(1, (value(last) || 0) / max));
      g.fillStyle = color;
      g.beginPath();
      g.arc(x(this.samples.length - 1), lastY, 3, 0, 2 * Math.PI);
      g.fill();
    };
    if (!last) return;
    line("#1f6feb", (s) => s.cpu_used_pct, cpuMax);
    line("#d2691e", (s) => s.mem_used_mib, memMax);
  }
}
