"""Transcribe upstream's admin-policy conformance tests (network-policy-api) into data cases.

Reads the Go tests and base manifests of one tag from the bare mirror, replays each test's
policy mutations on the objects (a small interpreter for the handful of statement shapes the
suite uses; anything else aborts), and writes one YAML case per upstream ConformanceTest.
"""
import copy, ipaddress, os, re, subprocess, sys
import yaml

MIRROR = '/work/.mirror/kubernetes-sigs+network-policy-api/repo'
HOST_PORTS_MAIN = [34345 + i for i in range(8)]  # upstream suite default range at main

def git(*a):
    return subprocess.run(['git', '-C', MIRROR] + list(a), check=True, capture_output=True, text=True).stdout

def load_cluster(path):
    objs = [o for o in yaml.safe_load_all(open(path)) if o]
    pods = {(o['metadata']['namespace'] + '/' + o['metadata']['name']): o for o in objs if o['kind'] == 'Pod'}
    nss = {o['metadata']['name']: o for o in objs if o['kind'] == 'Namespace'}
    return pods, nss

POKE = re.compile(r'PokeServer\(t, s\.ClientSet, &s\.KubeConfig, "([^"]+)", "([^"]+)", "(tcp|udp|sctp)",\s*(\w+)\.Status\.PodIP, int32\(([^)]*)\), s\.TimeoutConfig(?:\.RequestTimeout)?, (true|false)\)')
GETPOD = re.compile(r'(\w+) :?= kubernetes\.GetPod\(t, s\.Client, "([^"]+)", "([^"]+)"')
GETCNP = re.compile(r'(\w+) :?= kubernetes\.GetClusterNetworkPolicy\(t, s\.Client, "([^"]+)"')
GETNS = re.compile(r'(\w+) :?= kubernetes\.GetNamespace\(t, s\.Client, "([^"]+)"')

def key(o):
    md = o['metadata']
    return (o['kind'], md.get('namespace'), md['name'])

def ref(o):
    md = o['metadata']
    r = {'kind': o['kind'], 'name': md['name']}
    if md.get('namespace'):
        r['namespace'] = md['namespace']
    return r

def block(lines, i):
    """The statement starting at line i, up to its balanced closing brace/paren."""
    depth = 0; out = []
    j = i
    while True:
        s = lines[j]
        out.append(s)
        depth += s.count('{') + s.count('(') - s.count('}') - s.count(')')
        if depth <= 0:
            return ' '.join(x.strip() for x in out), j
        j += 1

def transcribe(tag, label, pods, nss):
    files = [f for f in git('ls-tree', '-r', '--name-only', tag, 'conformance/tests').split() if f.endswith('.go') and 'network-policy' in f]
    cases = []
    for f in files:
        src = git('show', f'{tag}:{f}')
        lines = src.split('\n')
        base = os.path.basename(f)
        test = None
        def new_step(title):
            test['steps'].append({'name': title, 'apply': [], 'delete': [], 'expect': []})
        i = 0
        while i < len(lines):
            ln = lines[i]; no = i + 1; s = ln.strip()
            if s.startswith('//'):
                i += 1; continue
            m = re.search(r'ShortName:\s*"([^"]+)"', ln)
            if m:
                test = {'name': m.group(1), 'line': no, 'steps': [], 'vars': {}, 'podvars': {}, 'strs': {}}
                cases.append((f, test)); i += 1; continue
            m = re.search(r'Manifests:\s*\[\]string\{"([^"]+)"\}', ln)
            if m:
                text = git('show', f'{tag}:conformance/{m.group(1)}')
                text = re.sub(r'\{\{ index \.HostNetworkPorts (\d) \}\}', lambda mm: str(HOST_PORTS_MAIN[int(mm.group(1))]), text)
                assert '{{' not in text, text
                test['manifest'] = m.group(1)
                objs = [o for o in yaml.safe_load_all(text) if o]
                for o in objs:
                    # `podSelector:` left empty in YAML is null; the API server stores it as {}.
                    if o['kind'] == 'NetworkPolicy' and o['spec'].get('podSelector') is None:
                        o['spec']['podSelector'] = {}
                test['state'] = {key(o): o for o in objs}
                test['initial'] = list(test['state'].values())
                test['pending'] = None
                i += 1; continue
            m = re.search(r't\.Run\("([^"]+)"', ln)
            if m:
                test['run'] = m.group(1); test['part'] = 1
                new_step(m.group(1))
                if len(test['steps']) == 1:
                    test['steps'][0]['apply'] = copy.deepcopy(test['initial'])
                i += 1; continue
            if test is None:
                i += 1; continue
            step = test['steps'][-1] if test['steps'] else None
            def changing():
                # A change after this step's probes opens a new step (the state it asserts moved on).
                if step is not None and step['expect']:
                    test['part'] += 1
                    new_step(f"{test['run']} (part {test['part']})")
                return test['steps'][-1]
            # v0.1.7 fetches: Name/Namespace literals, then `}, var)`.
            m = re.search(r'Namespace:\s*"([^"]+)"', ln)
            if m: test['pns'] = m.group(1)
            m = re.search(r'\bName:\s*"([^"]+)"', ln)
            if m and 'ObjectKey' in lines[i - 1] + lines[i - 2]:
                test['pname'] = m.group(1)
            m = re.match(r'\s*\}, (\w+)\)', ln)
            if m and test.get('pname'):
                test['podvars'][m.group(1)] = (test.get('pns'), test['pname'])
                test['pns'] = test['pname'] = None
                i += 1; continue
            m = GETPOD.search(ln)
            if m:
                test['podvars'][m.group(1)] = (m.group(2), m.group(3)); i += 1; continue
            m = GETCNP.search(ln) or GETNS.search(ln)
            if m:
                test['podvars'][m.group(1)] = (None, m.group(2)); i += 1; continue
            if 'PokeServer(' in ln:
                joined = ln + ' ' + lines[i + 1].strip()
                m = POKE.search(joined)
                if not m:
                    sys.exit(f'{f}:{no}: unparsed poke: {joined}')
                ns, pod, proto, var, port, ok = m.groups()
                pm = re.fullmatch(r's\.HostNetworkPorts\[(\d)\]', port)
                port = HOST_PORTS_MAIN[int(pm.group(1))] if pm else int(port)
                tns, tpod = test['podvars'][var]
                step['expect'].append({'from': f'{ns}/{pod}', 'to': f'{tns}/{tpod}', 'port': port,
                    'protocol': proto.upper(), 'allowed': ok == 'true', 'upstream': f'{base}:{no}'})
                i += 2; continue
            m = re.match(r'\s*(\w+) := "(\w+)"$', ln)
            if m:
                test['strs'][m.group(1)] = m.group(2); i += 1; continue
            m = re.match(r'\s*(\w+) :?= (\w+)\.DeepCopy\(\)$', ln)
            if m:
                target, src_var = m.group(1), m.group(2)
                _, name = test['podvars'][src_var]
                if target == 'mutateNamespace':
                    obj = nss[name] if (('Namespace', None, name) not in test['state']) else test['state'][('Namespace', None, name)]
                    test['vars']['mutateNamespace'] = copy.deepcopy(obj)
                else:
                    objs = [o for k, o in test['state'].items() if k[2] == name and k[0] != 'NetworkPolicy']
                    assert len(objs) == 1, (f, no, name)
                    test['vars']['mutate'] = copy.deepcopy(objs[0])
                i += 1; continue
            m = re.match(r'\s*(\w+) := mutate(?:\.DeepCopy\(\))?\.Spec\.(Egress|Ingress)\[(\d+)\]$', ln)
            if m:
                test['vars'][m.group(1)] = copy.deepcopy(test['vars']['mutate']['spec'][m.group(2).lower()][int(m.group(3))])
                i += 1; continue
            m = re.match(r'\s*mutate\.Spec\.(Egress|Ingress)\[(\d+)\] = mutate\.Spec\.(Egress|Ingress)\[(\d+)\]$', ln)
            if m:
                spec = test['vars']['mutate']['spec']
                spec[m.group(1).lower()][int(m.group(2))] = copy.deepcopy(spec[m.group(3).lower()][int(m.group(4))])
                i += 1; continue
            m = re.match(r'\s*mutate\.Spec\.(Egress|Ingress)\[(\d+)\] = (\w+)$', ln)
            if m:
                test['vars']['mutate']['spec'][m.group(1).lower()][int(m.group(2))] = copy.deepcopy(test['vars'][m.group(3)])
                i += 1; continue
            m = re.match(r'\s*mutate\.Spec\.(Egress|Ingress)\[(\d+)\]\.Action = \w+\.\w+RuleActionPass$', ln)
            if m:
                test['vars']['mutate']['spec'][m.group(1).lower()][int(m.group(2))]['action'] = 'Pass'
                i += 1; continue
            m = re.match(r'\s*mutate\.Spec\.Priority = (\d+)$', ln)
            if m:
                test['vars']['mutate']['spec']['priority'] = int(m.group(1)); i += 1; continue
            m = re.match(r'\s*(\w+)\.(Ports|Protocols) = ', ln)
            if m:
                stmt, i = block(lines, i)
                names = re.findall(r'(?:Destination)?NamedPort: &?(\w+)', stmt)
                assert len(names) == 1 and stmt.count('{') == 2, stmt
                value = test['strs'][names[0]]
                rule = test['vars'][m.group(1)]
                if m.group(2) == 'Ports':
                    rule['ports'] = [{'namedPort': value}]
                else:
                    rule['protocols'] = [{'destinationNamedPort': value}]
                i += 1; continue
            m = re.match(r'\s*var mask string$|\s*if net\.IsIPv4String|\s*mask = "/(32|128)"|\s*\} else \{$|\s*\}$', ln)
            if m:
                i += 1; continue
            m = re.match(r'\s*newRule := \[\]\w+\.(\w+)\{', ln)
            if m:
                stmt, i = block(lines, i)
                name = re.search(r'Name:\s*"([^"]+)"', stmt).group(1)
                action = re.search(r'Action:\s*"(\w+)"', stmt).group(1)
                cidrs = []
                for var in re.findall(r'CIDR\((\w+)\.Status\.PodIP \+ mask\)', stmt):
                    ip = pod_ip(pods, '%s/%s' % test['podvars'][var])
                    cidrs.append(f'{ip}/32')
                # Only networks peers in the shapes the suite uses; anything else must not pass silently.
                assert re.sub(r'\s', '', stmt).count('Networks:') == 1, stmt
                test['vars']['newRule'] = [{'name': name, 'action': action, 'to': [{'networks': cidrs}]}]
                i += 1; continue
            m = re.match(r'\s*mutate\.Spec\.Egress = append\(newRule, mutate\.Spec\.Egress\.\.\.\)$', ln)
            if m:
                test['vars']['mutate']['spec']['egress'] = test['vars']['newRule'] + test['vars']['mutate']['spec']['egress']
                i += 1; continue
            m = re.match(r'\s*mutateNamespace\.SetLabels\(map\[string\]string\{"([^"]+)": "([^"]+)"\}\)$', ln)
            if m:
                md = test['vars']['mutateNamespace']['metadata']
                # The API server always (re)sets kubernetes.io/metadata.name.
                md['labels'] = {m.group(1): m.group(2), 'kubernetes.io/metadata.name': md['name']}
                i += 1; continue
            if re.search(r'PatchNamespace\(', ln):
                st = changing(); obj = test['vars']['mutateNamespace']
                test['state'][key(obj)] = obj; st['apply'].append(copy.deepcopy(obj)); i += 1; continue
            if re.search(r'PatchClusterNetworkPolicy\(|s\.Client\.Patch\(ctx, mutate', ln):
                st = changing(); obj = test['vars']['mutate']
                test['state'][key(obj)] = obj; st['apply'].append(copy.deepcopy(obj)); i += 1; continue
            m = re.match(r'\s*err = s\.Client\.Delete\(ctx, (\w+)\)$', ln)
            if m:
                st = changing()
                ns, name = test['podvars'][m.group(1)]
                victims = [k for k in test['state'] if k[0] == 'NetworkPolicy' and k[1] == ns and k[2] == name]
                assert len(victims) == 1
                st['delete'].append(ref(test['state'].pop(victims[0]))); i += 1; continue
            if re.search(r'mutate|Spec\.|Delete|Patch|SetLabels|Create\(|Update\(', ln):
                sys.exit(f'{f}:{no}: statement not understood: {s}')
            i += 1
    out = []
    commit = git('rev-list', '-n1', tag).strip()
    for f, t in cases:
        steps = []
        for st in t['steps']:
            assert st['expect'], (f, t['name'], st['name'])
            d = {'name': st['name']}
            if st['apply']: d['apply'] = st['apply']
            if st['delete']: d['delete'] = st['delete']
            d['expect'] = st['expect']
            steps.append(d)
        out.append({'source': {'repo': 'kubernetes-sigs/network-policy-api', 'tag': label, 'commit': commit,
                    'file': f, 'test': t['name'], 'line': t['line'], 'manifest': 'conformance/' + t['manifest']},
                    'steps': steps})
    return out

def pod_ip(pods, name):
    return pods[name]['status']['podIP']

class Dumper(yaml.SafeDumper):
    pass

def _dict(d, data):
    # Probes and object references on one line each; objects in block style.
    flow = 'allowed' in data or ('kind' in data and 'metadata' not in data and len(data) <= 3)
    return d.represent_mapping('tag:yaml.org,2002:map', data.items(), flow_style=flow)
Dumper.add_representer(dict, _dict)

if __name__ == '__main__':
    cluster, outdir = sys.argv[1], sys.argv[2]
    pods, nss = load_cluster(cluster)
    for tag, label in [('v0.1.7', 'v0.1.7'), ('HEAD', 'main')]:
        os.makedirs(f'{outdir}/{label}', exist_ok=True)
        for case in transcribe(tag, label, pods, nss):
            src = case['source']
            header = (f"# Transcribed from {src['repo']} {src['file']} ({src['test']}) at {label}\n"
                      f"# ({src['commit']}). Generated by tools/transcribe.py; do not edit by hand.\n")
            with open(f"{outdir}/{label}/{src['test']}.yaml", 'w') as fh:
                fh.write(header)
                yaml.dump(case, fh, Dumper=Dumper, sort_keys=False, width=400, allow_unicode=True)
