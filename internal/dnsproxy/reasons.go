package dnsproxy

// Reasons a query is blocked or refused. They are the text of the RFC 8914
// Extended DNS Error and of the audit event's DNSDetail.Reason; reasons about
// a domain's stream end in " under <domain>".
const (
	ReasonNotAllowed   = "not on allowlist"
	ReasonDenied       = "on denylist"
	ReasonEncoded      = "encoded label"
	ReasonOversized    = "oversized name"
	ReasonBadTLD       = "invalid top-level domain"
	ReasonInvalidBytes = "invalid bytes in name"
	ReasonRateLimited  = "rate limited"
	ReasonRareType     = "rare query type rate limited"
	ReasonNoSandbox    = "unknown client"
	ReasonMalformed    = "malformed query"
	ReasonQType        = "query type not served"
	ReasonClass        = "query class not served"
	ReasonOpcode       = "opcode not implemented"
	ReasonEDNSVersion  = "unsupported EDNS version"
	ReasonUpstream     = "upstream failure"
	// ReasonLocalAnswer is followed by ": <address> (<kind>)".
	ReasonLocalAnswer = "local address in answer"

	// Stream reasons, suffixed with " under <domain>".
	ReasonInfoBudget    = "too much information in names"
	ReasonEncodedStream = "encoded labels"
	ReasonNXStream      = "mostly nonexistent names"
	ReasonTunnelTypes   = "tunnel record types"

	// ReasonAllCut: the sandbox cut off so many allowlisted domains that
	// their cut-offs fill its table; every name is refused until they
	// expire (fail closed, state.go).
	ReasonAllCut = "too many domains cut off"
)
