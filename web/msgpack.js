// Minimal MessagePack (https://github.com/msgpack/msgpack/blob/master/spec.md) for the protocol.
// encode: null, booleans, numbers (integers as ints, others as float64), strings, Uint8Array
// (bin), arrays and plain objects (maps with string keys; undefined values are left out).
// decode: every type except extensions (the protocol uses none).

const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

class Writer {
  constructor(size = 1024) {
    this.bytes = new Uint8Array(size);
    this.view = new DataView(this.bytes.buffer);
    this.pos = 0;
  }

  reserve(n) {
    if (this.pos + n <= this.bytes.length) return;
    let size = this.bytes.length * 2;
    while (size < this.pos + n) size *= 2;
    const bigger = new Uint8Array(size);
    bigger.set(this.bytes.subarray(0, this.pos));
    this.bytes = bigger;
    this.view = new DataView(bigger.buffer);
  }

  u8(v) { this.reserve(1); this.view.setUint8(this.pos, v); this.pos += 1; }
  u16(v) { this.reserve(2); this.view.setUint16(this.pos, v); this.pos += 2; }
  u32(v) { this.reserve(4); this.view.setUint32(this.pos, v); this.pos += 4; }
  i8(v) { this.reserve(1); this.view.setInt8(this.pos, v); this.pos += 1; }
  i16(v) { this.reserve(2); this.view.setInt16(this.pos, v); this.pos += 2; }
  i32(v) { this.reserve(4); this.view.setInt32(this.pos, v); this.pos += 4; }
  u64(v) { this.reserve(8); this.view.setBigUint64(this.pos, BigInt(v)); this.pos += 8; }
  i64(v) { this.reserve(8); this.view.setBigInt64(this.pos, BigInt(v)); this.pos += 8; }
  f64(v) { this.reserve(8); this.view.setFloat64(this.pos, v); this.pos += 8; }
  raw(b) { this.reserve(b.length); this.bytes.set(b, this.pos); this.pos += b.length; }

  result() { return this.bytes.slice(0, this.pos); }
}

function writeInt(w, v) {
  if (v >= 0) {
    if (v < 0x80) w.u8(v);
    else if (v <= 0xff) { w.u8(0xcc); w.u8(v); }
    else if (v <= 0xffff) { w.u8(0xcd); w.u16(v); }
    else if (v <= 0xffffffff) { w.u8(0xce); w.u32(v); }
    else { w.u8(0xcf); w.u64(v); }
  } else if (v >= -32) w.u8(v & 0xff);
  else if (v >= -0x80) { w.u8(0xd0); w.i8(v); }
  else if (v >= -0x8000) { w.u8(0xd1); w.i16(v); }
  else if (v >= -0x80000000) { w.u8(0xd2); w.i32(v); }
  else { w.u8(0xd3); w.i64(v); }
}

function writeLength(w, n, fix, fixMax, codes) {
  // codes: [8-bit, 16-bit, 32-bit] type bytes (null where the type has no 8-bit form)
  if (fix !== null && n <= fixMax) w.u8(fix | n);
  else if (codes[0] !== null && n <= 0xff) { w.u8(codes[0]); w.u8(n); }
  else if (n <= 0xffff) { w.u8(codes[1]); w.u16(n); }
  else { w.u8(codes[2]); w.u32(n); }
}

function write(w, value) {
  if (value === null || value === undefined) w.u8(0xc0);
  else if (value === true) w.u8(0xc3);
  else if (value === false) w.u8(0xc2);
  else if (typeof value === "number") {
    if (Number.isSafeInteger(value)) writeInt(w, value);
    else { w.u8(0xcb); w.f64(value); }
  } else if (typeof value === "string") {
    const b = utf8Encoder.encode(value);
    writeLength(w, b.length, 0xa0, 31, [0xd9, 0xda, 0xdb]);
    w.raw(b);
  } else if (value instanceof Uint8Array || value instanceof ArrayBuffer) {
    const b = value instanceof ArrayBuffer ? new Uint8Array(value) : value;
    writeLength(w, b.length, null, 0, [0xc4, 0xc5, 0xc6]);
    w.raw(b);
  } else if (Array.isArray(value) || ArrayBuffer.isView(value)) {
    writeLength(w, value.length, 0x90, 15, [null, 0xdc, 0xdd]);
    for (const item of value) write(w, item);
  } else if (typeof value === "object") {
    const entries = Object.entries(value).filter(([, v]) => v !== undefined);
    writeLength(w, entries.length, 0x80, 15, [null, 0xde, 0xdf]);
    for (const [k, v] of entries) { write(w, k); write(w, v); }
  } else {
    throw new TypeError(`msgpack: cannot encode a ${typeof value}`);
  }
}

/** Encode a value as one MessagePack message (Uint8Array). */
export function encode(value) {
  const w = new Writer();
  write(w, value);
  return w.result();
}

class Reader {
  constructor(bytes) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }

  take(n) {
    if (this.pos + n > this.bytes.length) throw new RangeError("msgpack: truncated message");
    const at = this.pos;
    this.pos += n;
    return at;
  }

  u8() { return this.view.getUint8(this.take(1)); }
  u16() { return this.view.getUint16(this.take(2)); }
  u32() { return this.view.getUint32(this.take(4)); }
  i8() { return this.view.getInt8(this.take(1)); }
  i16() { return this.view.getInt16(this.take(2)); }
  i32() { return this.view.getInt32(this.take(4)); }
  u64() { return Number(this.view.getBigUint64(this.take(8))); }
  i64() { return Number(this.view.getBigInt64(this.take(8))); }
  f32() { return this.view.getFloat32(this.take(4)); }
  f64() { return this.view.getFloat64(this.take(8)); }
  bin(n) { const at = this.take(n); return this.bytes.subarray(at, at + n); }
  str(n) { return utf8Decoder.decode(this.bin(n)); }
  array(n) { const out = new Array(n); for (let i = 0; i < n; i++) out[i] = this.value(); return out; }
  map(n) {
    const out = {};
    for (let i = 0; i < n; i++) { const k = this.value(); out[k] = this.value(); }
    return out;
  }

  value() {
    const t = this.u8();
    if (t < 0x80) return t;
    if (t < 0x90) return this.map(t & 0x0f);
    if (t < 0xa0) return this.array(t & 0x0f);
    if (t < 0xc0) return this.str(t & 0x1f);
    if (t >= 0xe0) return t - 0x100;
    switch (t) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return this.bin(this.u8());
      case 0xc5: return this.bin(this.u16());
      case 0xc6: return this.bin(this.u32());
      case 0xca: return this.f32();
      case 0xcb: return this.f64();
      case 0xcc: return this.u8();
      case 0xcd: return this.u16();
      case 0xce: return this.u32();
      case 0xcf: return this.u64();
      case 0xd0: return this.i8();
      case 0xd1: return this.i16();
      case 0xd2: return this.i32();
      case 0xd3: return this.i64();
      case 0xd9: return this.str(this.u8());
      case 0xda: return this.str(this.u16());
      case 0xdb: return this.str(this.u32());
      case 0xdc: return this.array(this.u16());
      case 0xdd: return this.array(this.u32());
      case 0xde: return this.map(this.u16());
      case 0xdf: return this.map(this.u32());
      default: throw new TypeError(`msgpack: unsupported type byte 0x${t.toString(16)}`);
    }
  }
}

/** Decode one MessagePack message (bin values come back as Uint8Array views). */
export function decode(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  const r = new Reader(bytes);
  const value = r.value();
  if (r.pos !== bytes.length) throw new RangeError("msgpack: trailing bytes after the message");
  return value;
}
