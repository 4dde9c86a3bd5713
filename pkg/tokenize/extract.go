package tokenize

import (
	"errors"
	"fmt"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// Errors of ExtractPrompt, to test with errors.Is. The returned error wraps
// one of them and names the byte offset and field; it never quotes the body,
// which holds user text.
var (
	// ErrSyntax means the body is not valid JSON (or not a JSON object).
	ErrSyntax = errors.New("malformed JSON")
	// ErrNoPrompt means the body has neither a non-null "prompt" nor
	// "messages", or has both.
	ErrNoPrompt = errors.New("no prompt")
	// ErrPromptShape means "prompt" or "messages" has a type the OpenAI API
	// does not allow (for example a number, a mixed array, or a token id
	// that is negative, fractional or above 2^32-1).
	ErrPromptShape = errors.New("unsupported prompt shape")
)

// maxDepth is the deepest nesting accepted, as encoding/json does, so a
// hostile body cannot grow the stack without bound.
const maxDepth = 10000

// maxPregrow bounds the capacity ExtractPrompt reserves up front, so a body
// made mostly of non-prompt data (an inline image) cannot make it reserve
// memory in proportion to its size.
const maxPregrow = 1 << 18

// extractor is one pass over a body. Tokens go straight into dst; values that
// a later duplicate key overrides are moved out of the way at the end
// (last key wins, as in encoding/json).
type extractor struct {
	b     []byte
	i     int
	dst   []uint32
	depth int

	f     *Fields   // nil: only the prompt is read
	hints hintState // nvext.agent_hints so far, for f
	out   outState  // max_tokens and max_completion_tokens so far, for f
	keyAt int       // offset of the top-level member's key being read, for f
}

// span is a range of dst holding the tokens of one value; ok is false when
// the value is absent or null.
type span struct {
	lo, hi int
	ok     bool
}

// ExtractPrompt appends the prompt's token ids from an OpenAI completions or
// chat completions request body to dst and returns the extended slice. It
// is Extract without the fields.
func ExtractPrompt(dst []uint32, body []byte) ([]uint32, error) {
	return Extract(dst, body, nil)
}

// Extract appends the prompt's token ids from an OpenAI completions or chat
// completions request body to dst, returns the extended slice, and, when f
// is not nil, fills f with the body's other fields the picker reads, all in
// one pass over the body.
//
// A "prompt" may be a string, an array of strings, an array of token ids
// (taken exactly) or an array of token-id arrays; the parts are concatenated.
// "messages" is a chat conversation (see the package doc). A body without
// either, or with both, fails with ErrNoPrompt; callers answer 400. Keys
// match exactly (JSON keys are case-sensitive, as the OpenAI API reads
// them) and the last of duplicate keys wins, as in encoding/json. The body
// is read once, in O(len(body)) time, and nothing is allocated beyond the
// growth of dst (and of f.Priority.Values) unless a key or a role contains
// escapes or the model name is longer than one byte. On error dst is
// returned truncated to its original length; f is complete after
// ErrNoPrompt (the whole body was read) and unspecified after any other
// error.
func Extract(dst []uint32, body []byte, f *Fields) ([]uint32, error) {
	start := len(dst)
	if want := min(len(body)/3, maxPregrow); cap(dst)-start < want {
		// One allocation instead of a doubling series: prompts run about
		// 3-6 body bytes per token.
		dst = slices.Grow(dst, want)
	}
	e := extractor{b: body, dst: dst, f: f}
	if f != nil {
		f.reset()
	}
	prompt, messages, err := e.top()
	if err != nil {
		return dst[:start], err
	}
	if f != nil {
		f.Hints = e.hints.resolve()
		e.out.resolve(f)
	}
	var s span
	switch {
	case prompt.ok && messages.ok:
		return dst[:start], fmt.Errorf("request body has both prompt and messages: %w", ErrNoPrompt)
	case prompt.ok:
		s = prompt
	case messages.ok:
		s = messages
	default:
		return dst[:start], fmt.Errorf("request body has neither prompt nor messages: %w", ErrNoPrompt)
	}
	return e.moveTo(start, s), nil
}

// moveTo makes the tokens of s start at lo and ends dst after them.
func (e *extractor) moveTo(lo int, s span) []uint32 {
	if s.lo != lo {
		copy(e.dst[lo:], e.dst[s.lo:s.hi])
	}
	return e.dst[:lo+s.hi-s.lo]
}

func (e *extractor) syntax(what string) error {
	return fmt.Errorf("request body byte %d: %s: %w", e.i, what, ErrSyntax)
}

func (e *extractor) shape(field, what string) error {
	return fmt.Errorf("request body byte %d: %s %s: %w", e.i, field, what, ErrPromptShape)
}

func (e *extractor) skipWS() {
	for e.i < len(e.b) {
		switch e.b[e.i] {
		case ' ', '\t', '\n', '\r':
			e.i++
		default:
			return
		}
	}
}

// peek returns the next non-whitespace byte, or 0 at the end.
func (e *extractor) peek() byte {
	e.skipWS()
	if e.i < len(e.b) {
		return e.b[e.i]
	}
	return 0
}

func (e *extractor) expect(c byte) error {
	if e.peek() != c {
		return e.syntax(fmt.Sprintf("want %q", c))
	}
	e.i++
	return nil
}

// top reads the whole body: an object whose "prompt" and "messages" values
// are tokenized and whose other values are only validated.
func (e *extractor) top() (prompt, messages span, err error) {
	if len(e.b) == 0 {
		err = fmt.Errorf("request body is empty: %w", ErrSyntax)
		return
	}
	if err = e.expect('{'); err != nil {
		return
	}
	e.depth = 1
	if e.f != nil {
		e.f.Priority.Open = e.i - 1
	}
	if e.peek() == '}' {
		e.i++
		if e.f != nil {
			e.f.Priority.Empty = true
		}
	} else {
		for {
			var key []byte
			e.skipWS()
			e.keyAt = e.i
			if key, err = e.readKey(); err != nil {
				return
			}
			switch string(key) {
			case "prompt":
				prompt, err = e.value(e.promptValue)
			case "messages":
				messages, err = e.value(e.messagesValue)
			default:
				if e.f == nil {
					err = e.skipValue()
				} else {
					err = e.field(key)
				}
			}
			if err != nil {
				return
			}
			if err = e.nextMember('}'); err == errEnd {
				err = nil
				break
			} else if err != nil {
				return
			}
		}
	}
	e.skipWS()
	if e.i != len(e.b) {
		err = e.syntax("data after the top-level object")
	}
	return
}

// errEnd is nextMember's internal signal that the container closed.
var errEnd = errors.New("end of container")

// nextMember consumes ',' (returning nil) or the closing byte (returning
// errEnd).
func (e *extractor) nextMember(closing byte) error {
	switch e.peek() {
	case ',':
		e.i++
		return nil
	case closing:
		e.i++
		return errEnd
	}
	return e.syntax(fmt.Sprintf("want ',' or %q", closing))
}

// readKey reads an object key and the colon after it. The key aliases the
// body unless it has escapes.
func (e *extractor) readKey() ([]byte, error) {
	if e.peek() != '"' {
		return nil, e.syntax("want an object key")
	}
	e.i++
	s, err := e.readString(nil)
	if err != nil {
		return nil, err
	}
	if err := e.expect(':'); err != nil {
		return nil, err
	}
	return s, nil
}

// value runs parse for a non-null value and returns the span of tokens it
// appended; null gives an empty, not-ok span.
func (e *extractor) value(parse func() error) (span, error) {
	if e.peek() == 'n' {
		return span{}, e.literal("null")
	}
	lo := len(e.dst)
	if err := parse(); err != nil {
		return span{}, err
	}
	return span{lo: lo, hi: len(e.dst), ok: true}, nil
}

func (e *extractor) literal(word string) error {
	if len(e.b)-e.i < len(word) || string(e.b[e.i:e.i+len(word)]) != word {
		return e.syntax("bad literal")
	}
	e.i += len(word)
	return nil
}

func (e *extractor) push() error {
	e.depth++
	if e.depth > maxDepth {
		return e.syntax("nested too deep")
	}
	return nil
}

// enter goes one level into a container whose opening byte was just read.
// It reports true, with the level left again, when the container closes
// at once (the closing byte is read); otherwise the caller leaves the level
// when it is done.
func (e *extractor) enter(closing byte) (bool, error) {
	if err := e.push(); err != nil {
		return false, err
	}
	if e.peek() == closing {
		e.i++
		e.depth--
		return true, nil
	}
	return false, nil
}

// promptValue reads a completions prompt (non-null).
func (e *extractor) promptValue() error {
	switch e.peek() {
	case '"':
		e.i++
		return e.tokString()
	case '[':
	default:
		if err := e.skipValue(); err != nil {
			return err
		}
		return e.shape("prompt", "is not a string or an array")
	}
	e.i++
	if empty, err := e.enter(']'); empty || err != nil {
		return err
	}
	defer func() { e.depth-- }()
	first := e.peek()
	if first != '"' && first != '[' {
		return e.idList()
	}
	for {
		c := e.peek()
		if (c == '"') != (first == '"') || (c == '[') != (first == '[') {
			return e.shape("prompt", "mixes element types")
		}
		var err error
		switch {
		case c == '"':
			e.i++
			err = e.tokString()
		case c == '[':
			e.i++
			err = e.tokenIDs()
		default:
			err = e.tokenID()
		}
		if err != nil {
			return err
		}
		if err = e.nextMember(']'); err == errEnd {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// tokenIDs reads the rest of an array of token ids (after '[').
func (e *extractor) tokenIDs() error {
	if empty, err := e.enter(']'); empty || err != nil {
		return err
	}
	defer func() { e.depth-- }()
	return e.idList()
}

// idList reads token ids up to and including the closing ']' of a non-empty
// array. Its loop handles the plain "1, 2, 3" layout in registers; anything
// else (leading zeros, fractions, other types, bad separators) goes to the
// general per-element path, which validates and reports it.
func (e *extractor) idList() error {
	b := e.b
	i := e.i
	dst := e.dst
	for {
		for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
			i++
		}
		s := i
		var v uint64
		for i < len(b) && b[i]-'0' < 10 && v <= (1<<32-1)/10 {
			v = v*10 + uint64(b[i]-'0')
			i++
		}
		if i == s || v > 1<<32-1 || (b[s] == '0' && i-s > 1) ||
			(i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E' || b[i]-'0' < 10)) {
			e.i, e.dst = s, dst
			return e.idListSlow()
		}
		dst = append(dst, uint32(v))
		for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
			i++
		}
		if i < len(b) && b[i] == ',' {
			i++
			continue
		}
		e.i, e.dst = i, dst
		if i < len(b) && b[i] == ']' {
			e.i++
			return nil
		}
		return e.syntax("want ',' or ']'")
	}
}

// idListSlow is idList one element at a time.
func (e *extractor) idListSlow() error {
	for {
		if err := e.tokenID(); err != nil {
			return err
		}
		if err := e.nextMember(']'); err == errEnd {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// tokenID reads one token id: a plain JSON integer in [0, 2^32-1].
func (e *extractor) tokenID() error {
	e.skipWS()
	b := e.b
	i := e.i
	if i < len(b) && b[i] >= '0' && b[i] <= '9' {
		var v uint64
		if b[i] == '0' {
			i++
		} else {
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				v = v*10 + uint64(b[i]-'0')
				if v > 1<<32-1 {
					e.i = i
					return e.shape("prompt", "token id exceeds 2^32-1")
				}
				i++
			}
		}
		if i >= len(b) || (b[i] != '.' && b[i] != 'e' && b[i] != 'E') {
			e.i = i
			e.dst = append(e.dst, uint32(v))
			return nil
		}
	}
	// Not a plain integer: still validate, then reject.
	if err := e.skipValue(); err != nil {
		return err
	}
	return e.shape("prompt", "element is not a token id")
}

// messagesValue reads a chat conversation (non-null).
func (e *extractor) messagesValue() error {
	if e.peek() != '[' {
		if err := e.skipValue(); err != nil {
			return err
		}
		return e.shape("messages", "is not an array")
	}
	e.i++
	empty, err := e.enter(']')
	if err != nil {
		return err
	}
	if !empty {
		for {
			if e.peek() != '{' {
				if err := e.skipValue(); err != nil {
					return err
				}
				return e.shape("messages", "element is not an object")
			}
			e.i++
			if err := e.message(); err != nil {
				return err
			}
			if err := e.nextMember(']'); err == errEnd {
				break
			} else if err != nil {
				return err
			}
		}
		e.depth--
	}
	e.dst = append(e.dst, genPrompt)
	return nil
}

// message reads one chat message (after '{') and appends
// start, content, role marker, role, end.
func (e *extractor) message() error {
	start := len(e.dst)
	e.dst = append(e.dst, msgStart)
	var content span
	var role []byte
	err := e.members(func(key []byte) (err error) {
		switch string(key) {
		case "content":
			content, err = e.value(e.contentValue)
		case "role":
			role, err = e.roleValue()
		default:
			err = e.skipValue()
		}
		return err
	})
	if err != nil {
		return err
	}
	e.dst = e.moveTo(start+1, content)
	e.dst = append(e.dst, msgRole)
	var t tokState
	for _, c := range role {
		e.dst = t.feed(e.dst, c)
	}
	e.dst = t.flush(e.dst)
	e.dst = append(e.dst, msgEnd)
	return nil
}

// members reads the rest of an object (after '{'), calling member with each
// key; member reads the value.
func (e *extractor) members(member func(key []byte) error) error {
	if empty, err := e.enter('}'); empty || err != nil {
		return err
	}
	defer func() { e.depth-- }()
	for {
		key, err := e.readKey()
		if err != nil {
			return err
		}
		if err := member(key); err != nil {
			return err
		}
		if err := e.nextMember('}'); err == errEnd {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// roleValue reads a role: a string (copied when it had escapes, since the
// scratch buffer is reused) or null.
func (e *extractor) roleValue() ([]byte, error) {
	switch e.peek() {
	case 'n':
		return nil, e.literal("null")
	case '"':
		e.i++
		return e.readString(nil)
	}
	if err := e.skipValue(); err != nil {
		return nil, err
	}
	return nil, e.shape("messages", "role is not a string")
}

// contentValue reads a message content: a string or an array of parts whose
// "text" strings are tokenized (other part types add nothing).
func (e *extractor) contentValue() error {
	switch e.peek() {
	case '"':
		e.i++
		return e.tokString()
	case '[':
	default:
		if err := e.skipValue(); err != nil {
			return err
		}
		return e.shape("messages", "content is not a string or an array")
	}
	e.i++
	if empty, err := e.enter(']'); empty || err != nil {
		return err
	}
	defer func() { e.depth-- }()
	for {
		if e.peek() != '{' {
			if err := e.skipValue(); err != nil {
				return err
			}
			return e.shape("messages", "content part is not an object")
		}
		e.i++
		if err := e.part(); err != nil {
			return err
		}
		if err := e.nextMember(']'); err == errEnd {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// part reads one content part (after '{').
func (e *extractor) part() error {
	start := len(e.dst)
	var text span
	err := e.members(func(key []byte) (err error) {
		if string(key) != "text" {
			return e.skipValue()
		}
		text, err = e.value(func() error {
			if e.peek() != '"' {
				if err := e.skipValue(); err != nil {
					return err
				}
				return e.shape("messages", "content part text is not a string")
			}
			e.i++
			return e.tokString()
		})
		return err
	})
	if err != nil {
		return err
	}
	e.dst = e.moveTo(start, text)
	return nil
}

// skipValue validates one JSON value without keeping it.
func (e *extractor) skipValue() error {
	switch e.peek() {
	case '"':
		e.i++
		_, err := e.readString(nil)
		return err
	case '{':
		e.i++
		if empty, err := e.enter('}'); empty || err != nil {
			return err
		}
		defer func() { e.depth-- }()
		for {
			if e.peek() != '"' {
				return e.syntax("want an object key")
			}
			e.i++
			if err := e.skipString(); err != nil {
				return err
			}
			if err := e.expect(':'); err != nil {
				return err
			}
			if err := e.skipValue(); err != nil {
				return err
			}
			if err := e.nextMember('}'); err == errEnd {
				return nil
			} else if err != nil {
				return err
			}
		}
	case '[':
		e.i++
		if empty, err := e.enter(']'); empty || err != nil {
			return err
		}
		defer func() { e.depth-- }()
		for {
			if err := e.skipValue(); err != nil {
				return err
			}
			if err := e.nextMember(']'); err == errEnd {
				return nil
			} else if err != nil {
				return err
			}
		}
	case 't':
		return e.literal("true")
	case 'f':
		return e.literal("false")
	case 'n':
		return e.literal("null")
	}
	return e.number()
}

// number validates a JSON number.
func (e *extractor) number() error {
	b := e.b
	i := e.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() bool {
		s := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > s
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		digits()
	default:
		e.i = i
		return e.syntax("want a value")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			e.i = i
			return e.syntax("bad number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			e.i = i
			return e.syntax("bad number")
		}
	}
	e.i = i
	return nil
}

// skipString validates the rest of a string (after the opening quote).
func (e *extractor) skipString() error {
	b := e.b
	for i := e.i; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			e.i = i + 1
			return nil
		case c == '\\':
			e.i = i
			_, n, err := e.escape()
			if err != nil {
				return err
			}
			i += n - 1
		case c < 0x20:
			e.i = i
			return e.syntax("control character in string")
		}
	}
	e.i = len(b)
	return e.syntax("unterminated string")
}

// readString returns the rest of a string (after the opening quote): a slice
// of the body when it has no escapes, else its decoded bytes appended to buf.
func (e *extractor) readString(buf []byte) ([]byte, error) {
	b := e.b
	start := e.i
	for i := start; i < len(b); i++ {
		c := b[i]
		if c == '"' {
			e.i = i + 1
			return b[start:i], nil
		}
		if c == '\\' {
			buf = append(buf, b[start:i]...)
			e.i = i
			return e.readEscaped(buf)
		}
		if c < 0x20 {
			e.i = i
			return nil, e.syntax("control character in string")
		}
	}
	e.i = len(b)
	return nil, e.syntax("unterminated string")
}

// readEscaped continues readString from an escape.
func (e *extractor) readEscaped(buf []byte) ([]byte, error) {
	b := e.b
	for e.i < len(b) {
		c := b[e.i]
		switch {
		case c == '"':
			e.i++
			return buf, nil
		case c == '\\':
			r, n, err := e.escape()
			if err != nil {
				return nil, err
			}
			buf = utf8.AppendRune(buf, r)
			e.i += n
		case c < 0x20:
			return nil, e.syntax("control character in string")
		default:
			buf = append(buf, c)
			e.i++
		}
	}
	return nil, e.syntax("unterminated string")
}

// escape decodes the escape at e.i and returns its rune and length in bytes,
// without moving e.i. Lone surrogates decode to U+FFFD, as encoding/json
// does, and a valid surrogate pair is one 12-byte escape.
func (e *extractor) escape() (rune, int, error) {
	b := e.b[e.i:]
	if len(b) < 2 {
		return 0, 0, e.syntax("unterminated escape")
	}
	switch b[1] {
	case '"', '\\', '/':
		return rune(b[1]), 2, nil
	case 'b':
		return '\b', 2, nil
	case 'f':
		return '\f', 2, nil
	case 'n':
		return '\n', 2, nil
	case 'r':
		return '\r', 2, nil
	case 't':
		return '\t', 2, nil
	case 'u':
		r, ok := hex4(b[2:])
		if !ok {
			return 0, 0, e.syntax("bad \\u escape")
		}
		if !utf16.IsSurrogate(r) {
			return r, 6, nil
		}
		if len(b) >= 12 && b[6] == '\\' && b[7] == 'u' {
			if r2, ok := hex4(b[8:]); ok {
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					return d, 12, nil
				}
			}
		}
		return utf8.RuneError, 6, nil
	}
	return 0, 0, e.syntax("bad escape")
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
