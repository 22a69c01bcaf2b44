//! [`SplitHandle`]: the printable name of one rank of a served split,
//! what a launcher hands a trainer process (`sbsplit://NAME@ADDR/SERVICE/RANK/RANKS`).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use streambatch_plan::Error;

/// Where one rank of a served split is read from: small, printable and
/// parsable (`sbsplit://NAME@ADDR/SERVICE/RANK/RANKS`), so that a launcher
/// can pass it to a trainer process on its command line. It holds no
/// secret: the trainer reaches the driver only with a certificate of the
/// cluster.
///
/// ```
/// use streambatch_split::SplitHandle;
/// let handle: SplitHandle = "sbsplit://driver@127.0.0.1:7500/00000000000000ff/1/2".parse().unwrap();
/// assert_eq!((handle.rank, handle.ranks), (1, 2));
/// assert_eq!(handle.to_string().parse::<SplitHandle>().unwrap(), handle);
/// assert!("sbsplit://driver@127.0.0.1:7500/ff/2/2".parse::<SplitHandle>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitHandle {
    /// The serving driver's certificate name.
    pub server: String,
    /// Its address.
    pub addr: SocketAddr,
    /// The split's id on the driver.
    pub service: u64,
    /// This handle's rank.
    pub rank: usize,
    /// The split's ranks.
    pub ranks: usize,
}

const SCHEME: &str = "sbsplit://";

impl fmt::Display for SplitHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}{}@{}/{:016x}/{}/{}",
            self.server, self.addr, self.service, self.rank, self.ranks
        )
    }
}

impl FromStr for SplitHandle {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::Invalid(format!("split handle `{text}`: {why}"));
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it does not start with sbsplit://"))?;
        let (server, rest) = rest
            .split_once('@')
            .ok_or_else(|| bad("no `NAME@` before the address"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [addr, service, rank, ranks] = parts[..] else {
            return Err(bad("expected ADDR/SERVICE/RANK/RANKS after the name"));
        };
        let handle = Self {
            server: server.to_string(),
            addr: addr.parse().map_err(|_| bad("a bad address"))?,
            service: u64::from_str_radix(service, 16).map_err(|_| bad("a bad split id"))?,
            rank: rank.parse().map_err(|_| bad("a bad rank"))?,
            ranks: ranks.parse().map_err(|_| bad("a bad number of ranks"))?,
        };
        if server.is_empty() || handle.rank >= handle.ranks {
            return Err(bad("no server name, or a rank not below the ranks"));
        }
        Ok(handle)
    }
}
