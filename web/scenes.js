// Built-in start images, drawn on a canvas (no files to download): a 832x480 PNG each.

export const WIDTH = 832;
export const HEIGHT = 480;

function sky(ctx, top, bottom, horizon) {
  const g = ctx.createLinearGradient(0, 0, 0, horizon);
  g.addColorStop(0, top);
  g.addColorStop(1, bottom);
  ctx.fillStyle = g;
  ctx.fillRect(0, 0, WIDTH, HEIGHT); // below the horizon: the bottom colour
}

function courtyard(ctx) {
  const horizon = HEIGHT * 0.45;
  sky(ctx, "#4682dc", "#c8e1fa", horizon);
  ctx.fillStyle = "#cdd2d7"; // the floor's fog colour, under the far rows
  ctx.fillRect(0, horizon, WIDTH, HEIGHT - horizon);
  // checkerboard floor in perspective: row at depth z spans y = horizon + 160 / z
  for (let row = 0; row < 40; row++) {
    const z0 = 0.5 + row * 0.5, z1 = z0 + 0.5;
    const y0 = horizon + 160 / z1, y1 = horizon + 160 / z0;
    if (y0 > HEIGHT) continue;
    for (let col = -30; col < 30; col++) {
      const x = (u, z) => WIDTH / 2 + (u * 160) / z;
      ctx.beginPath();
      ctx.moveTo(x(col, z1), y0);
      ctx.lineTo(x(col + 1, z1), y0);
      ctx.lineTo(x(col + 1, z0), y1);
      ctx.lineTo(x(col, z0), y1);
      ctx.closePath();
      const fog = Math.min(1, z0 / 20);
      const light = (row + col) % 2 === 0;
      const c = light ? [230, 210, 170] : [120, 90, 60];
      const f = c.map((v) => Math.round(v * (1 - fog) + 205 * fog));
      ctx.fillStyle = `rgb(${f[0]},${f[1]},${f[2]})`;
      ctx.fill();
    }
  }
  // two white walls with dark doorways
  ctx.fillStyle = "#f2efe8";
  ctx.fillRect(40, horizon - 120, 220, 150);
  ctx.fillRect(WIDTH - 260, horizon - 100, 200, 130);
  ctx.fillStyle = "#3b3430";
  ctx.fillRect(120, horizon - 60, 50, 90);
  ctx.fillRect(WIDTH - 190, horizon - 50, 45, 80);
}

function hills(ctx) {
  const horizon = HEIGHT * 0.55;
  sky(ctx, "#2b1d4f", "#f29a5c", horizon);
  ctx.fillStyle = "#ffd27a";
  ctx.beginPath();
  ctx.arc(WIDTH * 0.7, horizon - 40, 38, 0, 2 * Math.PI);
  ctx.fill();
  const layers = [["#5b4a6b", 60, 0.011, 0], ["#3e3a55", 45, 0.017, 1.3], ["#243244", 35, 0.023, 2.1]];
  layers.forEach(([color, amp, freq, phase], i) => {
    const base = horizon + i * 45;
    ctx.fillStyle = color;
    ctx.beginPath();
    ctx.moveTo(0, HEIGHT);
    for (let x = 0; x <= WIDTH; x += 8) {
      ctx.lineTo(x, base - amp * (0.6 + 0.4 * Math.sin(x * freq + phase)) * Math.cos(x * freq * 0.37));
    }
    ctx.lineTo(WIDTH, HEIGHT);
    ctx.closePath();
    ctx.fill();
  });
}

export const SCENES = { courtyard: "Courtyard (checkerboard)", hills: "Hills at dusk" };
const DRAW = { courtyard, hills };

/** Draw scene `name` on `canvas` (resized to 832x480). */
export function drawScene(canvas, name) {
  canvas.width = WIDTH;
  canvas.height = HEIGHT;
  DRAW[name](canvas.getContext("2d"));
}

/** PNG bytes of what `canvas` shows. */
export function canvasPng(canvas) {
  return new Promise((resolve, reject) => {
    canvas.toBlob(async (blob) => {
      if (blob === null) reject(new Error("could not encode the image as PNG"));
      else resolve(new Uint8Array(await blob.arrayBuffer()));
    }, "image/png");
  });
}
