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

/** Fill the <select>: the server's default first, then the offered sizes; `wanted` (a link's
 *  `?size=`) stays selected, marked as not offered when the server would refuse it. */
export function fillSizes(select, config, wanted) {
  const [h, w] = config.image_resolution;
  select.replaceChildren(new Option(`server default (${h}×${w})`, ""));
  const offered = offeredSizes(config);
  for (const s of offered) select.add(new Option(label(s), s));
  if (wanted && !offered.includes(wanted)) select.add(new Option(`${label(wanted)} (from the link)`, wanted));
  select.value = wanted || "";
}

/** What to do next after error `code` (PROTOCOL.md §5), said on the video; "" when nothing helps. */
export function nextStep(code, config) {
  if (code === "too_large") {
    const sizes = config ? offeredSizes(config).map(label).join(", ") : "";
    const limit = config && config.max_output_area ? ` (at most ${config.max_output_area} pixels here)` : "";
    return `Pick a smaller size${limit}: ${sizes || "the server default"}, then press Start.`;
  }
  if (code === "busy") return "The server is full: wait a little and press Start again.";
  if (code === "unauthorized") return "Enter this server's API key under Settings and press Start.";
  if (code === "bad_image") return "Pick another start image (PNG or JPEG) and press Start.";
  if (code === "session_limit") return "This session made all the chunks it may: press Start for a new one.";
  if (code === "session_lost" || code === "player" || code === "bad_message") return "Press Start to begin again.";
  if (code === "connection") return "Check that the server runs, then press Start.";
  return "";
}
