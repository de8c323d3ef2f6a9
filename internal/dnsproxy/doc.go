// Package dnsproxy is watcher's DNS allowlist proxy for sandboxes, with
// encoded-name (tunnel and exfiltration) detection. It is built on
// github.com/miekg/dns v1 for message parsing, packing and upstream
// exchanges; its own UDP and TCP loops feed raw packets into one handler
// chain (Server.HandlePacket), so the fuzzed path is the served path.
//
// # Chain
//
// parse (wire checks) → sandbox (SandboxResolver) → rate limit → name syntax
// → allow/deny → detection → cache → forward; chain.go says why each stage
// sits where it does. Blocked names get NXDOMAIN with the question echoed, an
// SOA for the name's domain in the authority section with Policy.NegativeTTL
// (default 30 s), and, for EDNS clients, an RFC 8914 Extended DNS Error:
// Filtered (17) with "not on allowlist", Blocked (15) with the detection
// reason ("encoded label", "too much information in names under example.com", …).
// Malformed or unsupported queries get FORMERR, NOTIMP or REFUSED and are
// never forwarded. Every decision becomes an audit.Event (Kind dns,
// Mechanism dnsproxy) and a counter (Server.Stats). OnAnswer reports the
// addresses of every allowed answer (from upstream or cache) with their
// remaining TTL, for the kernel egress map.
//
// # Local answers (DNS rebinding)
//
// An answer whose addresses include a local one (loopback, 0.0.0.0 and ::,
// link-local, RFC 1918 private, RFC 6598 shared, unique-local fc00::/7,
// multicast, reserved, the cloud metadata addresses 169.254.169.254,
// fd00:ec2::254 and others, IPv4-mapped, -compatible, NAT64 and 6to4 forms
// of these, and the host's own interface addresses) is refused with
// NXDOMAIN and an RFC 8914 Blocked reason "local address in answer: A
// (kind)", from upstream and from the cache alike, unless the sandbox's
// LocalAllow networks cover every such address. Local addresses are never
// passed to OnAnswer: the egress allowlist admits only public addresses,
// and explicit egress rules decide connections to local ones (rebind.go).
//
// # Sandboxes
//
// A SandboxResolver maps the query's source to a sandbox name:
// ListenerSandboxes (one listener per sandbox), AddrTable (exact client
// address:port, then longest prefix; the kernel side can fill it per
// socket), or any function. Unknown clients are refused.
//
// # Per-name detection
//
// Every name that passed the syntax check is split into its tracking domain
// (the registrable domain by the Public Suffix List; for TLDs not on the
// list, the last two labels, or the TLD itself for two-label names) and the
// head left of it. A name is judged to carry encoded data ("encoded label")
// when any of these holds:
//
//   - A head label of at least 8 characters switches letter case 3 or more
//     times while the domain part is in one case: base64 needs case, DNS
//     ignores it, so only an encoding puts data there (stubs do not apply
//     0x20 randomisation, and it would not spare the domain part).
//   - A head label, or the head with its dots removed, read as hex decodes
//     to at least 8 bytes of text (printable, at least a fifth letters) or
//     contains a run of 8 text bytes; read as base32 (needs a digit 2-7, at
//     least 13 characters) decodes to at least 8 bytes of text. Hashes and
//     keys decode to random bytes, 37% of them printable, so eight in a row
//     is rare (3.5e-4 per position).
//   - The head starts with two or more labels of one encoding alphabet that
//     together span at least 40 characters and 40 bits of evidence (below):
//     a payload split across labels. Machine-made hostnames put one hash
//     next to word labels, or mix alphabets.
//   - The summed evidence of the head's labels reaches 100 bits.
//   - The name is longer than 180 characters ("oversized name").
//   - The last label cannot be a TLD (digits, or over 24 characters):
//     "invalid top-level domain".
//
// Evidence of a label (6+ characters; punycode labels up to 30 excepted) is
// a log-likelihood ratio in bits: its cost under a character trigram model
// of real hostname labels minus its cost as a uniform random string over the
// smallest encoding alphabet containing it (hex 16, base32 32, base36 36,
// LDH 37, base64 64) plus 6 bits for its length. Positive means "better
// explained as encoded data". The model (hostmodel.bin, 27 kB, trigrams over
// a-z, one digit class, '-', other; interpolated 0.70/0.25/0.05 with bigram
// and unigram estimates) was trained by internal/dnsproxy/internal/genmodel on the Cisco
// Umbrella top-100k list with every evaluation name, and every name sharing a
// registrable domain with one, removed, and a fifth of the remaining
// registrable domains held out for validation (TestHoldoutFalsePositives);
// the malicious evaluation names are never read. Well-formed reverse names
// (in-addr.arpa octets, ip6.arpa nibbles) carry no evidence. Names whose
// registrable label has 12+ bits of evidence are counted as DGA-like
// (reported in Stats, not blocked: under an allowlist they are blocked
// anyway).
//
// # Stream detection
//
// Tunnel control traffic (pings, polls, short session ids) and slow exfil
// look ordinary one name at a time; their pattern does not. Per sandbox and
// tracking domain the proxy keeps an information budget (info.go, after
// ibHH, arXiv 2307.02614): the new bits each name head carries, as a
// description length against what the sandbox already sent under the
// domain (a known token costs a reference, a new one its length under the
// hostname model or as random data, whichever is less), plus, for every
// query that reaches the upstream, what its choice among the names and
// types already used could carry (channel.go: an aging frequency model of
// the (name, type) symbols, renewals in expiry order free), summed over a
// sliding window (default 10 min); docs/concepts/dns-channels.md. Over a window (default 5 min) it also
// counts names judged encoded (including names with bytes no hostname
// has), answers that were NXDOMAIN, and queries for TXT/NULL/CNAME/MX/SRV
// or private types. The domain is cut off (every name under it answered
// NXDOMAIN for BlockFor, default 30 min) when:
//
//   - the window's information exceeds the budget, default 4800 bits (600
//     bytes: a sustained byte per second is cut within 10 minutes) ("too
//     much information in names under D"),
//   - 2 names were judged encoded ("encoded labels under D"),
//   - after 8 distinct names, half the queries are tunnel record types
//     ("tunnel record types under D"), or three quarters of upstream answers
//     were NXDOMAIN ("mostly nonexistent names under D").
//
// A fixed count of distinct names (the earlier cut) refused a CDN's dozens
// of cheap names a minute and let data packed into few long names through.
// TestInformationBudgetReplay replays the corpus at realistic rates, a
// sandbox per session on a simulated clock: 0 of 2,396 benign sessions cut,
// every tunnel stream cut within 4 queries, 1 byte/s exfiltration in five
// encodings cut within 9 minutes (bench/dns/info.sh prints the table).
//
// Domains marked high_cardinality in the policy (CDNs) get a budget 16
// times larger. Memory is bounded: at most 4096 domains of allowlisted
// names per sandbox and 4096 of other names, each table its own LRU (a
// flood of unlisted names never evicts an allowlisted domain), and 4096
// cut-offs kept apart until they expire (full of allowlisted domains'
// cut-offs, the sandbox is cut off whole); per domain at most 256 name
// hashes for the stream counters, and 256 name hashes, 256 token hashes,
// 32 recent tokens and 256 symbols for the information budget; an LRU answer cache (Config.CacheEntries), and a
// two-generation memo of 32768 name analyses.
//
// On the shared corpus (TestCorpusQuality): 0 of 7,129 benign names flagged
// with their parents allowed, 306 of 307 data-carrying tunnel names detected
// alone, and every tunnel family's parent domain cut off within its first 14
// queries.
package dnsproxy
