// The output sizes the page offers, from the handshake (PROTOCOL.md §1): the server's
// `size_buckets` when it has them, else the usual sizes within its `max_output_area`, so that
// the list never holds a size the server refuses (`too_large`). And what to do after an error.

const LADDER = ["128*224", "256*448", "480*832", "720*1280"]; // 16:9-ish, the reference's 480*832 among them

const area = (size) => size.split("*").reduce((a, b) => a * Number(b), 1);
export const label = (size) => size.replace("*", "×");

/** ["H*W", ...] this server accepts as `size`. */
export function offeredSizes(config) {
  if (config.size_buckets && config.size_buckets.length) return config.size_buckets.map(([h, w]) => `${h}*${w}`);
  const limit = config.max_output_area || Infinity;
  return LADDER.filter((s) => area(s) <= limit);
}

/** The output [H, W] a session of `size` ("H*W": an area) gets for an h0 x w0 image, as the
 *  server decides it (camera/frames.py `output_size`, deployments/ingress/sizes.py): the area and
 *  the image's aspect, then the nearest of the server's `size_buckets` when it has them. */
export function outputSize(size, h0, w0, config) {
  const a = h0 / w0, maxArea = area(size);
  const side = (x) => 8 * Math.floor(Math.floor(x / 8) / 2) * 2;
  const h = side(Math.sqrt(maxArea * a)), w = side(Math.sqrt(maxArea / a));
  const buckets = config.size_buckets || [];
  if (!buckets.length) return [h, w];
  const distance = ([bh, bw]) => Math.abs(Math.log(bh / bw / a)) + Math.abs(Math.log((bh * bw) / (h * w)));
  return buckets.reduce((best, b) => (distance(b) < distance(best) ? b : best));
}

/** The label of a size option: the size, and what streams for the image when that differs. */
function optionLabel(size, config, image) {
  if (!image) return label(size);
  const [h, w] = outputSize(size, image.height, image.width, config);
  return `${h}*${w}` === size ? label(size) : `${label(size)} (streams ${h}×${w})`;
}

/** Fill the <select>: the server's default first, then the offered sizes; `wanted` (a link's
 *  `?size=`) stays selected, marked as not offered when the server would refuse it. Each option
 *  says what will stream for `image` ({width, height}: the start image), as the server decides. */
export function fillSizes(select, config, wanted, image) {
  select.replaceChildren(new Option(defaultLabel(config, image), ""));
  const offered = offeredSizes(config);
  for (const s of offered) select.add(new Option(optionLabel(s, config, image), s));
  if (wanted && !offered.includes(wanted)) select.add(new Option(`${label(wanted)} (from the link)`, wanted));
  select.value = wanted || "";
}

/** "server default (128×208)": the default size's output for `image`; for a 16:9 image (the
 *  handshake's `image_resolution`) when no image is known or the server names no default. */
function defaultLabel(config, image) {
  if (image && config.default_size) {
    const [h, w] = outputSize(config.default_size, image.height, image.width, config);
    return `server default (${h}×${w})`;
  }
  const [h, w] = config.image_resolution;
  return `server default (${h}×${w} for a 16:9 image)`;
}

/** Relabel the options for another start image (the values and the choice stay). */
export function relabelSizes(select, config, image) {
  for (const option of select.options) {
    if (option.value === "") option.text = defaultLabel(config, image);
    else if (!option.text.endsWith("(from the link)")) option.text = optionLabel(option.value, config, image);
  }
}

/** What to do next after error `code` (PROTOCOL.md §5), said on the video; "" when nothing helps. */
export function nextStep(code, config) {
  if (code === "too_large") {
    const sizes = config ? offeredSizes(config).map(label).join(", ") : "";
    const limit = config && config.max_output_area ? ` (at most ${config.max_output_area} pixels here)` : "";
    return `Pick a smaller size${limit}: ${sizes || "the server default"}, then press Start.`;
  }
  if (code === "busy") return "The server is full: wait a little and press Start again.";
  if (code === "unauthorized") return "This server needs an API key: enter it in the API key field (or add #api_key=… to the page's link) and press Start.";
  if (code === "bad_image") return "Pick another start image (PNG or JPEG) and press Start.";
  if (code === "session_limit") return "This session made all the chunks it may: press Start for a new one.";
  if (code === "session_lost" || code === "player" || code === "bad_message") return "Press Start to begin again.";
  if (code === "connection") return "Check that the server runs, then press Start.";
  return "";
}
