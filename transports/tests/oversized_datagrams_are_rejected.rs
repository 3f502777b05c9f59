//! A datagram over MAX_DATAGRAM is refused with a typed error and not sent; one of exactly
//! MAX_DATAGRAM bytes goes through.

mod common;

use bytes::Bytes;
use common::{connected, within, ALL};
use std::time::Duration;
use tela_core::MAX_DATAGRAM;
use tela_transports::DatagramError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_over_the_limit_are_rejected_not_sent() {
    for transport in ALL {
        let p = connected(transport).await;
        let too_big = Bytes::from(vec![7u8; MAX_DATAGRAM + 1]);
        assert_eq!(
            p.dialler.send_datagram(too_big.clone()),
            Err(DatagramError::TooLarge { len: MAX_DATAGRAM + 1, max: MAX_DATAGRAM }),
            "{transport}"
        );
        assert!(p.acceptor.send_datagram(too_big).is_err(), "{transport}");

        // Nothing of it arrived: the next datagram the peer reads is the one that fits.
        let fits = Bytes::from(vec![9u8; MAX_DATAGRAM]);
        let got = within("datagram of exactly MAX_DATAGRAM", async {
            loop {
                p.dialler.send_datagram(fits.clone()).expect("fits");
                if let Ok(got) = tokio::time::timeout(Duration::from_millis(200), p.acceptor.read_datagram()).await {
                    return got.expect("read");
                }
            }
        })
        .await;
        assert_eq!(got, fits, "{transport}");
    }
}
