package podmetrics

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrSyntax is wrapped by Parse errors about a malformed line of a series
// that Parse uses.
var ErrSyntax = errors.New("malformed metrics line")

// role is what a series means to Parse.
type role uint8

const (
	roleNone role = iota
	roleWaiting
	roleRunning
	roleKV
	roleKVLegacy  // vLLM before kv_cache_usage_perc: gpu_cache_usage_perc
	roleCacheInfo // info series whose labels carry block size and count
	roleBlockSize // TRT-LLM: block size as the value
	roleLoRA
	rolePromptTokens // counter: prompt tokens past prefill
	roleGenTokens    // counter: output tokens generated
	roleFinished     // counter: requests finished
	numRoles
)

// roleOf maps a series name to its role for engine e (SPEC §9).
func roleOf(e Engine, name []byte) role {
	switch e {
	case EngineVLLM:
		switch string(name) {
		case "vllm:num_requests_waiting":
			return roleWaiting
		case "vllm:num_requests_running":
			return roleRunning
		case "vllm:kv_cache_usage_perc":
			return roleKV
		case "vllm:gpu_cache_usage_perc":
			return roleKVLegacy
		case "vllm:cache_config_info":
			return roleCacheInfo
		case "vllm:lora_requests_info":
			return roleLoRA
		case "vllm:prompt_tokens_total":
			return rolePromptTokens
		case "vllm:generation_tokens_total":
			return roleGenTokens
		case "vllm:request_success_total":
			return roleFinished
		}
	case EngineSGLang:
		switch string(name) {
		case "sglang:num_queue_reqs":
			return roleWaiting
		case "sglang:num_running_reqs":
			return roleRunning
		case "sglang:token_usage":
			return roleKV
		case "sglang:cache_config_info":
			return roleCacheInfo
		case "sglang:prompt_tokens_total":
			return rolePromptTokens
		case "sglang:generation_tokens_total":
			return roleGenTokens
		case "sglang:num_requests_total":
			return roleFinished
		}
	case EngineTRTLLM:
		switch string(name) {
		case "trtllm_num_requests_waiting":
			return roleWaiting
		case "trtllm_num_requests_running":
			return roleRunning
		case "trtllm_kv_cache_utilization":
			return roleKV
		case "trtllm_kv_cache_tokens_per_block":
			return roleBlockSize
		}
	}
	return roleNone
}

// infoLabels are the cache_config_info labels holding block size and count.
func infoLabels(e Engine) (blockSize, numBlocks string) {
	if e == EngineSGLang {
		return "page_size", "num_pages"
	}
	return "block_size", "num_gpu_blocks"
}

// maxCount bounds Waiting and Running; a larger value is not a queue length.
const maxCount = 1 << 30

// parser is the state of one Parse call.
type parser struct {
	engine Engine
	page   []byte
	i      int
	line   int

	// Per role: the values seen, whether a value was unusable, and whether a
	// TYPE line made the series a summary or histogram (not a number).
	sum      [numRoles]float64
	max      [numRoles]float64
	seen     [numRoles]bool
	bad      [numRoles]bool
	excluded [numRoles]bool

	bsLabel, nbLabel string
	blockSize        int
	numBlocks        int
	// The newest lora_requests_info series so far.
	lora                      bool
	loraValue                 float64
	loraRunning, loraWaiting  []byte
	loraMax                   []byte
	curRunning, curWaiting    []byte // labels of the line being read
	curMax                    []byte
	curBlockSize, curNumBlock []byte
}

// Parse reads a Prometheus text exposition page of engine e into Metrics.
// Only the series of SPEC §9 are decoded; an error (wrapping ErrSyntax)
// means one of their lines is malformed, and the scrape should count as
// failed. Lines of other series are not validated.
func Parse(e Engine, page []byte) (Metrics, error) {
	p := parser{engine: e, page: page}
	p.bsLabel, p.nbLabel = infoLabels(e)
	for p.i < len(p.page) {
		p.line++
		if err := p.parseLine(); err != nil {
			return Metrics{}, fmt.Errorf("%s metrics line %d: %w", e, p.line, err)
		}
	}
	return p.result(), nil
}

func (p *parser) skipBlank() {
	for p.i < len(p.page) && (p.page[p.i] == ' ' || p.page[p.i] == '\t') {
		p.i++
	}
}

// skipLine moves past the next newline.
func (p *parser) skipLine() {
	if j := bytes.IndexByte(p.page[p.i:], '\n'); j >= 0 {
		p.i += j + 1
	} else {
		p.i = len(p.page)
	}
}

func (p *parser) at(c byte) bool { return p.i < len(p.page) && p.page[p.i] == c }

func syntax(msg string) error { return fmt.Errorf("%s: %w", msg, ErrSyntax) }

func isNameStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':'
}

func isNameByte(c byte) bool { return isNameStart(c) || c >= '0' && c <= '9' }

// name reads an unquoted metric name.
func (p *parser) name() []byte {
	s := p.i
	for p.i < len(p.page) && isNameByte(p.page[p.i]) {
		p.i++
	}
	return p.page[s:p.i]
}

// quoted reads a double-quoted string starting at p.i, decoding the
// exposition escapes (\\, \", \n). The result aliases the page unless it had
// escapes.
func (p *parser) quoted() ([]byte, error) {
	p.i++ // opening quote
	s := p.i
	for p.i < len(p.page) {
		switch p.page[p.i] {
		case '"':
			p.i++
			return p.page[s : p.i-1], nil
		case '\n':
			return nil, syntax("newline in quoted string")
		case '\\':
			return p.quotedEscaped(s)
		}
		p.i++
	}
	return nil, syntax("unterminated quoted string")
}

func (p *parser) quotedEscaped(s int) ([]byte, error) {
	buf := append([]byte(nil), p.page[s:p.i]...)
	for p.i < len(p.page) {
		c := p.page[p.i]
		switch c {
		case '"':
			p.i++
			return buf, nil
		case '\n':
			return nil, syntax("newline in quoted string")
		case '\\':
			if p.i+1 >= len(p.page) {
				return nil, syntax("unterminated escape")
			}
			switch p.page[p.i+1] {
			case '\\', '"':
				buf = append(buf, p.page[p.i+1])
			case 'n':
				buf = append(buf, '\n')
			default:
				return nil, syntax("invalid escape")
			}
			p.i += 2
			continue
		}
		buf = append(buf, c)
		p.i++
	}
	return nil, syntax("unterminated quoted string")
}

// parseLine reads one line: blank, comment, or sample.
func (p *parser) parseLine() error {
	p.skipBlank()
	if p.i >= len(p.page) {
		return nil
	}
	switch c := p.page[p.i]; {
	case c == '\n':
		p.i++
		return nil
	case c == '#':
		p.comment()
		return nil
	case c == '{':
		// UTF-8 form: {"name", label="value", ...} value
		p.i++
		p.skipBlank()
		if !p.at('"') {
			p.skipLine()
			return nil
		}
		name, err := p.quoted()
		if err != nil {
			p.skipLine()
			return nil // not a series we can name, so not one we use
		}
		r := roleOf(p.engine, name)
		if r == roleNone {
			p.skipLine()
			return nil
		}
		p.skipBlank()
		switch {
		case p.at(','):
			p.i++
			if err := p.labels(r); err != nil {
				return err
			}
		case p.at('}'):
			p.i++
		default:
			return syntax("want ',' or '}' after the quoted metric name")
		}
		return p.sample(r)
	case isNameStart(c):
		r := roleOf(p.engine, p.name())
		if r == roleNone {
			p.skipLine()
			return nil
		}
		p.skipBlank()
		if p.at('{') {
			p.i++
			if err := p.labels(r); err != nil {
				return err
			}
		}
		return p.sample(r)
	}
	p.skipLine()
	return nil
}

// comment handles "# TYPE name type": a series we use that is declared a
// summary or histogram holds no plain number, so its role stays unknown.
// Every other comment is skipped.
func (p *parser) comment() {
	defer p.skipLine()
	p.i++ // '#'
	p.skipBlank()
	if !bytes.HasPrefix(p.page[p.i:], []byte("TYPE")) {
		return
	}
	p.i += len("TYPE")
	if !p.at(' ') && !p.at('\t') {
		return
	}
	p.skipBlank()
	var name []byte
	switch {
	case p.at('"'):
		n, err := p.quoted()
		if err != nil {
			return
		}
		name = n
	default:
		name = p.name()
	}
	r := roleOf(p.engine, name)
	if r == roleNone {
		return
	}
	p.skipBlank()
	s := p.i
	for p.i < len(p.page) && p.page[p.i] != '\n' {
		p.i++
	}
	switch strings.ToLower(strings.TrimRight(string(p.page[s:p.i]), " \t")) {
	case "summary", "histogram", "gauge_histogram", "gaugehistogram":
		p.excluded[r] = true
	}
}

// labels reads label pairs after '{' up to and including '}', keeping the
// ones role r needs.
func (p *parser) labels(r role) error {
	for {
		p.skipBlank()
		if p.at('}') {
			p.i++
			return nil
		}
		var name []byte
		switch {
		case p.at('"'):
			n, err := p.quoted()
			if err != nil {
				return err
			}
			name = n
		case p.i < len(p.page) && isNameStart(p.page[p.i]) && p.page[p.i] != ':':
			s := p.i
			for p.i < len(p.page) && isNameByte(p.page[p.i]) && p.page[p.i] != ':' {
				p.i++
			}
			name = p.page[s:p.i]
		default:
			return syntax("want a label name")
		}
		p.skipBlank()
		if !p.at('=') {
			return syntax("want '=' after a label name")
		}
		p.i++
		p.skipBlank()
		if !p.at('"') {
			return syntax("want a quoted label value")
		}
		v, err := p.quoted()
		if err != nil {
			return err
		}
		switch r {
		case roleLoRA:
			switch string(name) {
			case "running_lora_adapters":
				p.curRunning = v
			case "waiting_lora_adapters":
				p.curWaiting = v
			case "max_lora":
				p.curMax = v
			}
		case roleCacheInfo:
			switch string(name) {
			case p.bsLabel:
				p.curBlockSize = v
			case p.nbLabel:
				p.curNumBlock = v
			}
		}
		p.skipBlank()
		switch {
		case p.at(','):
			p.i++
		case p.at('}'):
			p.i++
			return nil
		default:
			return syntax("want ',' or '}' after a label")
		}
	}
}

// sample reads the value and optional timestamp of a series line of role r
// and records it.
func (p *parser) sample(r role) error {
	p.skipBlank()
	s := p.i
	for p.i < len(p.page) && p.page[p.i] != ' ' && p.page[p.i] != '\t' && p.page[p.i] != '\n' {
		p.i++
	}
	v, err := parseFloat(p.page[s:p.i])
	if err != nil {
		return err
	}
	p.skipBlank()
	if p.i < len(p.page) && p.page[p.i] != '\n' {
		s = p.i
		for p.i < len(p.page) && p.page[p.i] != ' ' && p.page[p.i] != '\t' && p.page[p.i] != '\n' {
			p.i++
		}
		if _, err := strconv.ParseInt(string(p.page[s:p.i]), 10, 64); err != nil {
			return syntax("timestamp is not an integer")
		}
		p.skipBlank()
		if p.i < len(p.page) && p.page[p.i] != '\n' {
			return syntax("data after the timestamp")
		}
	}
	if p.i < len(p.page) {
		p.i++ // newline
	}
	p.record(r, v)
	return nil
}

// parseFloat reads a sample value as the exposition format allows it
// (Go float syntax, NaN and ±Inf, no hex floats or digit separators).
func parseFloat(b []byte) (float64, error) {
	if len(b) == 0 {
		return 0, syntax("missing value")
	}
	if bytes.ContainsAny(b, "pP_") {
		return 0, syntax("unsupported character in value")
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return 0, syntax("value is not a number")
	}
	return v, nil
}

// record folds one sample into the role's state.
func (p *parser) record(r role, v float64) {
	switch r {
	case roleWaiting, roleRunning:
		if math.IsNaN(v) || v < 0 || v > maxCount {
			p.bad[r] = true
		}
		p.sum[r] += v
	case rolePromptTokens, roleGenTokens, roleFinished:
		if math.IsNaN(v) || v < 0 || math.IsInf(v, 0) {
			p.bad[r] = true
		}
		p.sum[r] += v
	case roleKV, roleKVLegacy:
		if math.IsNaN(v) || v < 0 || math.IsInf(v, 0) {
			p.bad[r] = true
		}
		if !p.seen[r] || v > p.max[r] {
			p.max[r] = v
		}
	case roleCacheInfo:
		if p.blockSize == 0 {
			p.blockSize = positiveInt(p.curBlockSize)
		}
		if p.numBlocks == 0 {
			p.numBlocks = positiveInt(p.curNumBlock)
		}
	case roleBlockSize:
		if p.blockSize == 0 && v >= 1 && v <= maxCount && v == math.Trunc(v) {
			p.blockSize = int(v)
		}
	case roleLoRA:
		// The value is the time the state was current; the newest wins.
		if !math.IsNaN(v) && (!p.lora || v > p.loraValue) {
			p.lora = true
			p.loraValue = v
			p.loraRunning, p.loraWaiting, p.loraMax = p.curRunning, p.curWaiting, p.curMax
		}
	}
	p.seen[r] = true
	// The next line starts with no labels.
	p.curRunning, p.curWaiting, p.curMax = nil, nil, nil
	p.curBlockSize, p.curNumBlock = nil, nil
}

// positiveInt parses a label value such as "16"; anything else (vLLM says
// "None" before the cache is sized) gives 0, meaning unknown.
func positiveInt(b []byte) int {
	n, err := strconv.Atoi(string(b))
	if err != nil || n < 1 || n > maxCount {
		return 0
	}
	return n
}

// result turns the folded state into Metrics.
func (p *parser) result() Metrics {
	var m Metrics
	usable := func(r role) bool { return p.seen[r] && !p.bad[r] && !p.excluded[r] }
	if usable(roleWaiting) && p.sum[roleWaiting] <= maxCount {
		m.Waiting = int(math.Round(p.sum[roleWaiting]))
		m.Known |= Waiting
	}
	if usable(roleRunning) && p.sum[roleRunning] <= maxCount {
		m.Running = int(math.Round(p.sum[roleRunning]))
		m.Known |= Running
	}
	switch {
	case usable(roleKV):
		m.KVCacheUsage = min(p.max[roleKV], 1)
		m.Known |= KVCacheUsage
	case !p.seen[roleKV] && usable(roleKVLegacy):
		m.KVCacheUsage = min(p.max[roleKVLegacy], 1)
		m.Known |= KVCacheUsage
	}
	if p.blockSize > 0 && !p.excluded[roleCacheInfo] && !p.excluded[roleBlockSize] {
		m.BlockSize = p.blockSize
		m.Known |= BlockSize
	}
	if p.numBlocks > 0 && !p.excluded[roleCacheInfo] {
		m.NumBlocks = p.numBlocks
		m.Known |= NumBlocks
	}
	if usable(rolePromptTokens) && !math.IsInf(p.sum[rolePromptTokens], 0) {
		m.PromptTokens = p.sum[rolePromptTokens]
		m.Known |= PromptTokens
	}
	if usable(roleGenTokens) && !math.IsInf(p.sum[roleGenTokens], 0) {
		m.GenerationTokens = p.sum[roleGenTokens]
		m.Known |= GenerationTokens
	}
	if usable(roleFinished) && !math.IsInf(p.sum[roleFinished], 0) {
		m.Finished = p.sum[roleFinished]
		m.Known |= Finished
	}
	if p.lora && !p.excluded[roleLoRA] {
		m.LoRA = LoRAInfo{
			Running:   splitAdapters(p.loraRunning),
			Waiting:   splitAdapters(p.loraWaiting),
			MaxLoRA:   positiveInt(p.loraMax),
			UpdatedAt: p.loraValue,
		}
		m.Known |= LoRA
	}
	return m
}

// splitAdapters splits vLLM's comma-separated adapter list.
func splitAdapters(b []byte) []string {
	var out []string
	for part := range strings.SplitSeq(string(b), ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
