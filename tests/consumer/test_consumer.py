"""The installed package as a C or C++ user links it (tests/consumer/CMakeLists.txt runs this under CTest):
install this build into a fresh prefix, build project/ outside the tree with find_package(Tandem) and with
pkg-config, run both, and check what was installed (stripped library, debug info beside it, the version file's
compatibility rule). Standard library only."""
import glob
import os
import shutil
import subprocess
import tempfile
import unittest

BUILD = os.environ["TANDEM_BUILD_DIR"]
VERSION = os.environ["TANDEM_VERSION"]
CMAKE = os.environ.get("TANDEM_CMAKE", "cmake")
CC = os.environ.get("TANDEM_CC", "cc")
SPLIT = os.environ.get("TANDEM_SPLIT_DEBUG", "1") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env=None, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", timeout=240,
                       env=dict(os.environ, **(env or {})))
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    return p


def sections(path):
    return run(["readelf", "-S", "-W", path]).stdout


class Installed(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tandem_consumer_")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        run([CMAKE, "--install", BUILD, "--prefix", cls.prefix])
        libs = glob.glob(os.path.join(cls.prefix, "lib*", "libtandem.so.%s" % VERSION)) + \
            glob.glob(os.path.join(cls.prefix, "lib*", "*", "libtandem.so.%s" % VERSION))
        assert len(libs) == 1, "installed libtandem.so.%s: %s" % (VERSION, libs)
        cls.lib = libs[0]
        cls.libdir = os.path.dirname(cls.lib)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_layout_and_soname(self):
        major, minor = VERSION.split(".")[:2]
        for rel in ("include/tandem/tandem.h", "bin/tandem"):
            self.assertTrue(os.path.exists(os.path.join(self.prefix, rel)), rel)
        self.assertTrue(os.path.islink(os.path.join(self.libdir, "libtandem.so")))
        dyn = run(["readelf", "-d", self.lib]).stdout
        self.assertIn("[libtandem.so.%s.%s]" % (major, minor), dyn)
        self.assertTrue(os.path.exists(os.path.join(self.libdir, "cmake", "Tandem", "TandemConfig.cmake")))
        self.assertTrue(os.path.exists(os.path.join(self.libdir, "pkgconfig", "tandem.pc")))
        # the installed command runs from the prefix (its RPATH finds the installed library)
        out = run([os.path.join(self.prefix, "bin", "tandem"), "version"]).stdout
        self.assertIn(VERSION, out)

    @unittest.skipUnless(SPLIT, "configured with TANDEM_INSTALL_SPLIT_DEBUG=OFF")
    def test_library_is_stripped_with_debug_info_beside_it(self):
        self.assertNotIn(".debug_info", sections(self.lib))
        debug = os.path.join(self.libdir, ".debug", os.path.basename(self.lib) + ".debug")
        self.assertTrue(os.path.exists(debug), debug)
        self.assertIn(".debug_info", sections(debug))
        link = run(["readelf", "--string-dump=.gnu_debuglink", self.lib]).stdout
        self.assertIn(os.path.basename(debug), link)
        self.assertLess(os.path.getsize(self.lib), os.path.getsize(debug))

    def configure(self, want, build):
        return run([CMAKE, "-S", os.path.join(HERE, "project"), "-B", build, "-DCMAKE_PREFIX_PATH=" + self.prefix,
                    "-DTANDEM_WANT_VERSION=" + want, "-DCMAKE_C_COMPILER=" + CC], check=False)

    def test_find_package_and_link(self):
        build = os.path.join(self.tmp, "cmake-build")
        p = self.configure(VERSION, build)
        self.assertEqual(p.returncode, 0, p.stdout)
        run([CMAKE, "--build", build])
        out = run([os.path.join(build, "consumer")]).stdout
        self.assertIn("consumer ok %s 61706" % VERSION, out)  # lenet5's parameters

    def test_an_older_minor_is_not_compatible(self):
        major, minor = (int(x) for x in VERSION.split(".")[:2])
        p = self.configure("%d.%d" % (major, minor - 1), os.path.join(self.tmp, "old-build"))
        self.assertNotEqual(p.returncode, 0, "0.x minor versions may break the ABI: %s" % p.stdout[-500:])
        self.assertIn("Tandem", p.stdout)

    def test_pkg_config(self):
        env = {"PKG_CONFIG_PATH": os.path.join(self.libdir, "pkgconfig")}
        self.assertEqual(run(["pkg-config", "--modversion", "tandem"], env=env).stdout.strip(), VERSION)
        flags = run(["pkg-config", "--cflags", "--libs", "tandem"], env=env).stdout.split()
        exe = os.path.join(self.tmp, "consumer-pc")
        run([CC, "-std=c99", os.path.join(HERE, "project", "main.c"), "-o", exe] + flags +
            ["-Wl,-rpath," + self.libdir])
        self.assertIn("consumer ok", run([exe]).stdout)

    def test_the_installed_python_package_loads_the_installed_library(self):
        # The package lands in P/lib/python3/dist-packages, the library in P's libdir: outside the loader's search
        # path for any prefix but /usr, the package found no library ("cannot load libtandem.so") until the install
        # told it where the library lies (_installed.py).
        pkgs = glob.glob(os.path.join(self.prefix, "lib*", "python3*", "*-packages"))
        self.assertEqual(len(pkgs), 1, pkgs)
        env = dict(os.environ, PYTHONPATH=pkgs[0])
        env.pop("TANDEM_LIBRARY", None)
        p = subprocess.run(["/usr/bin/python3", "-c", "import tandem; print(tandem.version(), tandem.LIBRARY_PATH)"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, env=env,
                           cwd=self.tmp)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:])
        self.assertIn(VERSION, p.stdout)
        self.assertEqual(os.path.realpath(p.stdout.split()[-1]), os.path.realpath(self.lib))


if __name__ == "__main__":
    unittest.main()
