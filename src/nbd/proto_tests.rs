//! Round trips of every wire structure, and the option parsers on exact bytes.

use super::*;

#[test]
fn greeting_round_trip() {
    let b = encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    assert_eq!(&b[..8], b"NBDMAGIC");
    assert_eq!(&b[8..16], b"IHAVEOPT");
    assert_eq!(decode_greeting(&b), Some(3));
    let mut bad = b;
    bad[0] ^= 1;
    assert_eq!(decode_greeting(&bad), None);
}

#[test]
fn option_header_round_trip() {
    let h = OptionHeader {
        option: OPT_GO,
        len: 1234,
    };
    assert_eq!(OptionHeader::decode(&h.encode()), Some(h));
    let mut bad = h.encode();
    bad[7] ^= 1;
    assert_eq!(OptionHeader::decode(&bad), None);
}

#[test]
fn option_reply_round_trip() {
    let h = OptionReplyHeader {
        option: OPT_LIST,
        reply_type: REP_ERR_UNSUP,
        len: 7,
    };
    assert_eq!(OptionReplyHeader::decode(&h.encode()), Some(h));
    let mut out = Vec::new();
    write_option_reply(&mut out, OPT_GO, REP_ACK, b"xy").unwrap();
    let hdr: [u8; OPTION_REPLY_HEADER_LEN] = out[..20].try_into().unwrap();
    let d = OptionReplyHeader::decode(&hdr).unwrap();
    assert_eq!((d.option, d.reply_type, d.len), (OPT_GO, REP_ACK, 2));
    assert_eq!(&out[20..], b"xy");
}

/// NBD_OPT_GO data as qemu sends it: name "disk1", one info request (BLOCK_SIZE).
#[test]
fn go_request_exact_bytes() {
    let bytes = [
        0, 0, 0, 5, b'd', b'i', b's', b'k', b'1', // name
        0, 1, // count
        0, 3, // NBD_INFO_BLOCK_SIZE
    ];
    let req = InfoRequest::decode(&bytes).unwrap();
    assert_eq!(req.name, "disk1");
    assert_eq!(req.infos, vec![INFO_BLOCK_SIZE]);
    assert_eq!(req.encode(), bytes);
    // Short, trailing and non-UTF-8 data are all rejected.
    assert_eq!(InfoRequest::decode(&bytes[..bytes.len() - 1]), None);
    let mut long = bytes.to_vec();
    long.push(0);
    assert_eq!(InfoRequest::decode(&long), None);
    let mut bad_utf8 = bytes;
    bad_utf8[4] = 0xff;
    assert_eq!(InfoRequest::decode(&bad_utf8), None);
    // A name length beyond the data.
    assert_eq!(InfoRequest::decode(&[0xff, 0xff, 0xff, 0xff, 0, 0]), None);
}

#[test]
fn info_request_default_export_no_infos() {
    let bytes = [0, 0, 0, 0, 0, 0];
    let req = InfoRequest::decode(&bytes).unwrap();
    assert_eq!(req.name, "");
    assert!(req.infos.is_empty());
}

/// NBD_OPT_SET_META_CONTEXT data: export "d", one query "base:allocation".
#[test]
fn set_meta_context_exact_bytes() {
    let mut bytes = vec![0, 0, 0, 1, b'd', 0, 0, 0, 1, 0, 0, 0, 15];
    bytes.extend_from_slice(b"base:allocation");
    let req = MetaRequest::decode(&bytes).unwrap();
    assert_eq!(req.export, "d");
    assert_eq!(req.queries, vec!["base:allocation".to_string()]);
    assert_eq!(req.encode(), bytes);
    // A count larger than the data can hold fails without allocating for it.
    let huge = [0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(MetaRequest::decode(&huge), None);
    assert_eq!(MetaRequest::decode(&bytes[..bytes.len() - 1]), None);
}

#[test]
fn info_round_trips() {
    let infos = [
        Info::Export {
            size: 1 << 40,
            flags: 0x1234,
        },
        Info::Name("disk1".into()),
        Info::BlockSize {
            min: 1,
            preferred: 4096,
            max: 32 << 20,
        },
    ];
    for i in infos {
        assert_eq!(Info::decode(&i.encode()), Some(i));
    }
    assert_eq!(Info::decode(&[0, 9]), None);
    assert_eq!(Info::decode(&[0, 0, 1]), None);
}

#[test]
fn rep_server_and_meta_context_round_trip() {
    assert_eq!(
        decode_rep_server(&encode_rep_server("abc")),
        Some("abc".into())
    );
    let m = encode_meta_context(BASE_ALLOCATION_ID, BASE_ALLOCATION);
    assert_eq!(
        decode_meta_context(&m),
        Some((BASE_ALLOCATION_ID, BASE_ALLOCATION.into()))
    );
}

#[test]
fn export_name_reply_zeroes() {
    assert_eq!(encode_export_name_reply(5, 1, false).len(), 134);
    let r = encode_export_name_reply(5, 1, true);
    assert_eq!(r, [0, 0, 0, 0, 0, 0, 0, 5, 0, 1]);
}

#[test]
fn request_round_trip() {
    let r = Request {
        flags: CMD_FLAG_FUA,
        command: CMD_WRITE,
        cookie: 0xdead_beef_0102_0304,
        offset: 1 << 33,
        len: 4096,
    };
    let b = r.encode();
    assert_eq!(Request::decode(&b), Some(r));
    assert_eq!(r.payload_len(), 4096);
    assert_eq!(Request::decode(&b[..27]), None);
    let mut bad = b;
    bad[0] = 0;
    assert_eq!(Request::decode(&bad), None);
}

#[test]
fn simple_reply_round_trip() {
    let r = SimpleReply {
        error: 22,
        cookie: 99,
    };
    assert_eq!(SimpleReply::decode(&r.encode()), Some(r));
}

#[test]
fn chunk_header_round_trip() {
    let c = ChunkHeader {
        flags: REPLY_FLAG_DONE,
        chunk_type: REPLY_TYPE_ERROR,
        cookie: 7,
        len: 12,
    };
    assert_eq!(ChunkHeader::decode(&c.encode()), Some(c));
}

#[test]
fn error_payload_round_trip_and_truncation() {
    let p = encode_error_payload(5, "boom");
    assert_eq!(decode_error_payload(&p), Some((5, "boom".into())));
    let long = "é".repeat(3000); // 6000 bytes, 2 per char
    let (_, msg) = decode_error_payload(&encode_error_payload(5, &long)).unwrap();
    assert_eq!(msg.len(), MAX_STRING_LEN);
}

#[test]
fn block_status_round_trip() {
    let d = vec![(4096, STATE_HOLE | STATE_ZERO), (512, 0)];
    let p = encode_block_status(1, &d);
    assert_eq!(decode_block_status(&p), Some((1, d)));
}

#[test]
fn descriptors_split_cap_and_limit() {
    let hole = |len| Extent {
        len,
        hole: true,
        zero: true,
    };
    let data = |len| Extent {
        len,
        hole: false,
        zero: false,
    };
    let big = u64::from(u32::MAX) + 10;
    let d = extents_to_descriptors(&[hole(big), data(5)], u64::MAX, 10);
    assert_eq!(d, vec![(u32::MAX, 3), (10, 3), (5, 0)]);
    // Capped to the limit.
    assert_eq!(extents_to_descriptors(&[data(100)], 40, 10), vec![(40, 0)]);
    // REQ_ONE.
    assert_eq!(
        extents_to_descriptors(&[data(1), hole(1)], 100, 1),
        vec![(1, 0)]
    );
    // Zero-length runs vanish.
    assert_eq!(
        extents_to_descriptors(&[data(0), hole(2)], 100, 5),
        vec![(2, 3)]
    );
}

#[test]
fn cursor_never_panics_on_short_input() {
    let mut c = Cursor::new(&[1, 2, 3]);
    assert_eq!(c.u32(), None);
    assert_eq!(c.u16(), Some(0x0102));
    assert_eq!(c.u16(), None);
    assert_eq!(c.bytes(usize::MAX), None);
    assert_eq!(c.rest(), &[3]);
    assert!(c.is_empty());
}
