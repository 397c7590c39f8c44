"""PyTorch definitions of Tandem's zoo models (engine/nn/zoo.cpp), layer for layer, so the benchmark compares the
same networks. Shared by bench_train.py and the spec cross-check."""
import torch
import torch.nn as nn


def mlp(c, h, w, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, classes))


def lenet5(c, h, w, classes):
    fh, fw = ((h + 4 - 4) // 2 - 4) // 2, ((w + 4 - 4) // 2 - 4) // 2
    return nn.Sequential(nn.Conv2d(c, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * fh * fw, 120), nn.ReLU(), nn.Linear(120, 84),
                         nn.ReLU(), nn.Linear(84, classes))


def conv_bn(cin, cout, k, s, p, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, s, p, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = conv_bn(cin, cout, 3, stride, 1, act=nn.ReLU)
        self.b = conv_bn(cout, cout, 3, 1, 1)
        self.down = conv_bn(cin, cout, 1, stride, 0) if stride != 1 or cin != cout else None
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.b(self.a(x)) + (self.down(x) if self.down is not None else x))


def resnet18(c, h, w, classes):
    layers = [conv_bn(c, 64, 3, 1, 1, act=nn.ReLU)]
    cin = 64
    for i, planes in enumerate([64, 128, 256, 512]):
        for j in range(2):
            layers.append(Basic(cin, planes, 2 if i > 0 and j == 0 else 1))
            cin = planes
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def make_divisible(v, d=8):
    r = max(d, int(v + d / 2) // d * d)
    return r + d if r < 0.9 * v else r


class Inverted(nn.Module):
    def __init__(self, cin, cout, stride, t):
        super().__init__()
        hidden = cin * t
        layers = [] if t == 1 else [conv_bn(cin, hidden, 1, 1, 0, act=nn.ReLU6)]
        layers += [conv_bn(hidden, hidden, 3, stride, 1, groups=hidden, act=nn.ReLU6), conv_bn(hidden, cout, 1, 1, 0)]
        self.body = nn.Sequential(*layers)
        self.res = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return y + x if self.res else y


def mobilenetv2(c, h, w, classes, wm=1.0):
    cin = make_divisible(32 * wm)
    layers = [conv_bn(c, cin, 3, 1, 1, act=nn.ReLU6)]
    for t, ch, n, s in [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                        (6, 320, 1, 1)]:
        out = make_divisible(ch * wm)
        for i in range(n):
            layers.append(Inverted(cin, out, s if i == 0 else 1, t))
            cin = out
    last = make_divisible(1280 * max(1.0, wm))
    layers += [conv_bn(cin, last, 1, 1, 0, act=nn.ReLU6), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(last, classes)]
    return nn.Sequential(*layers)


def vgg16(c, h, w, classes):
    layers, cin = [], c
    for v in [64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0]:
        if v == 0:
            layers.append(nn.MaxPool2d(2))
            h, w = h // 2, w // 2
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU()]
            cin = v
    layers += [nn.Flatten(), nn.Linear(512 * h * w, classes)]
    return nn.Sequential(*layers)


def alexnet(c, h, w, classes):
    h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    h, w = h // 2 // 2 // 2, w // 2 // 2 // 2
    return nn.Sequential(
        nn.Conv2d(c, 64, 3, 2, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(64, 192, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(), nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256 * h * w, 4096),
        nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, classes))


MODELS = {"mlp": mlp, "lenet5": lenet5, "resnet18": resnet18, "mobilenetv2": mobilenetv2, "vgg16": vgg16,
          "alexnet": alexnet}
DEFAULT_INPUT = {"mlp": (1, 28, 28), "lenet5": (1, 28, 28)}


def build(name, classes=10, shape=None):
    shape = shape or DEFAULT_INPUT.get(name, (3, 32, 32))
    return MODELS[name](*shape, classes), shape


def macs(model, shape):
    """Multiply-adds of the conv and linear layers for one sample."""
    total = [0]

    def hook(m, inp, out):
        if isinstance(m, nn.Conv2d):
            total[0] += out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        elif isinstance(m, nn.Linear):
            total[0] += m.in_features * m.out_features
    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    for h in hs:
        h.remove()
    return total[0]


if __name__ == "__main__":
    for n in MODELS:
        m, s = build(n)
        print(n, s, sum(p.numel() for p in m.parameters()), macs(m, s))
